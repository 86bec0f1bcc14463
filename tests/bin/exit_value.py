"""raise SystemExit(<argv[1] evaluated>): every kind of exit value Python's main has a rule for."""
import sys


class Odd:
    """An object that is neither None nor an int: printed with str(), exit 1."""

    def __str__(self) -> str:
        return "odd object"


class BigInt(int):
    """An int subclass: PyLong_Check holds, so it is an exit status like any int."""


raise SystemExit(eval(sys.argv[1], {"Odd": Odd, "BigInt": BigInt}))

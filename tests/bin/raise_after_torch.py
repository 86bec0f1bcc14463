"""Import torch, print a line to stdout, then raise ValueError (argv[1] as its message)."""
import sys

import torch  # noqa: F401 (the entry imports torch: warm_start auto forks it)

print("before the error")


def fail(message: str) -> None:
    raise ValueError(message)


fail(sys.argv[1])

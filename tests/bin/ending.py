"""End as argv[2] says, leaving what Python's own shutdown flushes and runs to the interpreter.

Writes into directory argv[1]: an atexit handler's file, a module-level file never closed, a
logging FileHandler never flushed, and lines from a non-daemon thread that outlives the script.
Ways to end: 'return', 'exit3', 'exitmsg', 'raise', 'interrupt'. An object's __del__ at exit
prints 'finalized' (Python prints it; the bootstrap, which skips finalization, does not).
"""
import atexit
import logging
import os
import sys
import threading
import time

out, how = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(os.path.join(out, "atexit"), "w").write("ran\n"))
unclosed = open(os.path.join(out, "unclosed"), "w")
unclosed.write("all of it\n")
log = logging.getLogger("ending")
log.addHandler(logging.FileHandler(os.path.join(out, "logged")))
log.warning("logged line")


def late() -> None:
    time.sleep(0.3)
    with open(os.path.join(out, "thread"), "w") as f:
        f.write("joined\n")


threading.Thread(target=late).start()


class Finalized:
    def __del__(self) -> None:
        print("finalized", flush=True)


class Touchy:
    """Answers __class__ with code, as torch's deprecated reduce_op does: nobody may ask at exit."""

    def __getattribute__(self, name: str) -> object:
        if name == "__class__":
            print("touched", flush=True)
        return object.__getattribute__(self, name)


keep = Finalized()
touchy = Touchy()
print("last line", end="")  # no newline, no flush: stdout must still be complete
if how == "exit3":
    sys.exit(3)
if how == "exitmsg":
    sys.exit("a message instead of a code")
if how == "raise":
    raise RuntimeError("the script failed")
if how == "interrupt":
    raise KeyboardInterrupt

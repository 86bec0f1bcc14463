"""Prints terminal control sequences (clear screen, set title, bell, CR, backspace, C1 CSI)
on stdout and stderr, then exits with argv[1] (default 0)."""
import sys

evil = "A\x1b[2J\x1b]0;pwned\x07B\rC\bD\tE\u009b31mF\x7fG\x00H"
print(evil, flush=True)
print("err " + evil, file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

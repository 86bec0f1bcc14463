"""Print the value of the variable named argv[1] the ways a careless worker might, then exit 1.

argv[2] "stream": on stdout whole; on stderr in two writes of one line, then at the end of a
2000-character line (the report's cut falls inside it). "long": across the console's 64 KiB
cut of a stdout line. "record": in the message and traceback of a torch-style @record error
file (TORCHELASTIC_ERROR_FILE), as a repr would show it. "half": the first half of it as the
last, unterminated line on stdout and stderr (as a worker killed inside a print leaves it).
"""
import json
import os
import sys
import time

name, mode = sys.argv[1], sys.argv[2]
secret = os.environb[name.encode()]
out, err = sys.stdout.buffer, sys.stderr.buffer
if mode == "stream":
    out.write(b"token=" + secret + b"\n")
    out.flush()
    half = len(secret) // 2
    err.write(b"split: " + secret[:half])
    err.flush()
    time.sleep(0.3)  # the two halves reach the launcher in two reads
    err.write(secret[half:] + b" end\n")
    err.write(b"x" * 1995 + secret + b"\n")
    err.flush()
elif mode == "long":
    out.write(b"y" * (64 * 1024 - 5) + secret + b"z" * 10 + b"\n")
elif mode == "record":
    value = os.environ[name]
    callstack = f'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: bad key {value!r}\n'
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": f"ValueError: bad key {value}",
                               "extraInfo": {"py_callstack": callstack, "timestamp": "0"}}}, f)
elif mode == "half":
    for stream in (out, err):
        stream.write(b"half: " + secret[:len(secret) // 2])
        stream.flush()
sys.exit(1)

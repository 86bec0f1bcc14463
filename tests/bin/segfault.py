"""Rank 1 dies of SIGSEGV (a real one, from ctypes); the others wait to be stopped."""
import ctypes
import os
import time

if os.environ["RANK"] == "1":
    ctypes.string_at(0)
time.sleep(600)

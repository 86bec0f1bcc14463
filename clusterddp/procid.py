"""Which process a pid is: a pid alone names whatever process holds that number now.

A record that names a process by pid (``launcher.json``) outlives the process; the kernel
then hands the number to a stranger. Before a signal goes to a recorded pid, the pid must be
proved to be the same process: same boot (``/proc/sys/kernel/random/boot_id``), same host and
same start time (field 22 of ``/proc/<pid>/stat``, ticks since boot, which no two processes of
one boot share for one pid). The proof and the signal go through one pidfd where the kernel
has them (Linux 5.3+), so the pid cannot be reused between the check and the kill.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from typing import NamedTuple

#: The largest pid Linux hands out (``PID_MAX_LIMIT`` on 64-bit: 2^22).
PID_MAX = 4_194_304


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as a record can name it for later: not just its pid."""

    pid: int
    #: ``/proc/<pid>/stat`` field 22 (clock ticks after boot); None where there is no /proc.
    start_time: int | None
    #: The kernel's boot id; a pid and a start time only mean something within one boot.
    boot_id: str | None
    host: str

    def as_record(self) -> dict[str, object]:
        return {"pid": self.pid, "start_time": self.start_time, "boot_id": self.boot_id}


def valid_pid(value: object) -> int | None:
    """``value`` as a pid when it is one: a plain positive int in Linux's pid range.

    Refuses what ``os.kill`` would take to mean something else: 0 (the caller's process group),
    negatives (a group, or -1: every process the user may signal), bools, floats, huge ints.
    """
    if type(value) is not int or not 0 < value <= PID_MAX:
        return None
    return value


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` that place a process (numbered as in proc(5))."""

    #: Field 3: R, S, D, Z, T...
    state: str
    #: Field 4.
    ppid: int
    #: Field 5: the process group.
    pgrp: int
    #: Field 22: clock ticks after boot.
    start_time: int


def proc_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat`` read once (the one parser of it); None when the process (or
    /proc) is gone or the line cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = stat.rpartition(b")")[2].split()
    try:
        return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``; None when the process (or /proc) is gone."""
    stat = proc_stat(pid)
    return stat.start_time if stat is not None else None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read(64).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(pid, start_time(pid), boot_id(), socket.gethostname())


class NotTheProcess(Exception):
    """The pid no longer (or never did) name the recorded process; the reason is the message."""


def why_not_running(identity: ProcessIdentity) -> str | None:
    """Why the pid cannot be proved to be the process ``identity`` names (another host's
    record, another boot, a record without a start time, a pid gone or reused); None: it is."""
    if identity.host != socket.gethostname():
        return f"it ran on host {identity.host}, this is {socket.gethostname()}"
    if identity.start_time is None or identity.boot_id is None:
        return "the record has no start time to prove the pid is still the launcher"
    if identity.boot_id != boot_id():
        return "it was started before this machine last booted"
    now = start_time(identity.pid)
    if now is None:
        return f"pid {identity.pid} is not running"
    if now != identity.start_time:
        return f"pid {identity.pid} is now another process (started at another time)"
    return None


def signal_process(identity: ProcessIdentity, signum: int) -> None:
    """Send ``signum`` to the process ``identity`` names, and only to it; NotTheProcess,
    saying why (``why_not_running``), when the pid cannot be proved to be that process."""
    pidfd = _open_pidfd(identity.pid)
    try:
        why = why_not_running(identity)  # checked with the pidfd held: the pid cannot change hands
        if why is not None:
            raise NotTheProcess(why)
        try:  # with a pidfd opened before the check, the signal reaches the checked process
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(identity.pid, signum)
        except ProcessLookupError:
            raise NotTheProcess(f"pid {identity.pid} is not running") from None
        except PermissionError:
            raise NotTheProcess(f"pid {identity.pid} belongs to another user") from None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; None where the kernel or Python has none (then ``os.kill``)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except ProcessLookupError:
        raise NotTheProcess(f"pid {pid} is not running") from None
    except OSError:  # ENOSYS (an old kernel), EPERM under a seccomp filter: check, then kill
        return None

"""Everything the head, the remote launchers, the supervisor and the workers agree on.

Four parties talk without importing each other: the SSH head (``launch/ssh``), the launcher
it starts on every host (``clusterddp run --watch-stdin --emit-result``), the supervisor
(``launch/supervise/supervisor.py``) and every worker's bootstrap (``launch/start/bootstrap.py``). What
travels between them (line markers and their JSON, a byte on stdin, signals, variable names,
files in the run's log directory) is spelled here and nowhere else:

- ``CLUSTERDDP_RESULT {json}``, remote launcher's stdout -> head (``--emit-result``):
  ``result_line`` / ``parse_result``; with the restart verdict's inputs the head lacks
  (whether any of the host's ranks completed a step), so the head judges as a node does
- ``CLUSTERDDP_STACKS {json}``, remote launcher's stdout -> head, one per dump:
  ``stacks_line`` / ``parse_stacks``; its stderr block, hidden by the head: ``stacks_block_title``
- ``CLUSTERDDP_PROGRESS {json}``, remote launcher's stdout -> head, at most every 0.5 s while
  its ranks' progress files change: ``progress_line`` / ``parse_progress`` (the head names
  the slow host from every host's records)
- ``S`` on stdin, head -> remote launcher, "dump your stacks": ``STACKS_REQUEST_BYTE``
- ``I``/``T``/``H``/``Q`` on stdin, head -> remote launcher, just before EOF: "the head got
  SIGINT/SIGTERM/SIGHUP/SIGQUIT", so every host stops as a node that got it itself:
  ``stop_request_byte`` / ``stop_requested``
- ``E<K>\n`` and ``R<K> <P>[ <NODE_RANK> <W0>,<W1>,...[ <ADDR>]]\n`` on stdin, head -> a launcher
  started with ``--await-restart``: "end attempt K" (tear its workers down, report, wait) and
  "run attempt K in place on master port P" (as node NODE_RANK of a job whose nodes run W0,
  W1, ... workers, when its nodes changed; its master at ADDR when node 0 went)
  (``end_attempt_word`` / ``restart_word``;
  ``StdinWords`` reads them, and the bytes above, from the stream)
- ``SIGRTMIN+4``, ``clusterddp stacks`` -> the run's launcher: ``STACKS_REQUEST_SIGNAL``
- ``SIGRTMIN+3``, supervisor -> worker, dump stacks and keep running: ``DUMP_SIGNAL``
- SIGTERM, SIGINT, SIGHUP, SIGQUIT to a launcher or to the SSH head: stop the job in an
  orderly way (``STOP_SIGNALS``; workers learn them as ``TORCHELASTIC_SIGNALS_TO_HANDLE``);
  the workers get ``worker_stop_signal`` of it (Ctrl-C stays SIGINT), SIGKILL after the grace
- variables the supervisor gives every worker: ``STACKS_FILE_ENV`` (the bootstrap dumps
  there), ``HEARTBEAT_FILE_ENV`` (``train.heartbeat()`` touches it), ``SUPERVISOR_ID_ENV``
  (the reaper finds the job's processes by it)
- files in ``logs/<run-id>/`` that ``clusterddp stacks`` reads: ``launcher.json``
  (``write_launcher_file`` / ``read_launcher_file``) and ``stacks-<time>-<pid>.txt``
  (``write_stacks_report`` / ``stacks_reports``)
- ``CLUSTERDDP_DOCTOR {json}``, the doctor's worker (rank 0) -> ``clusterddp doctor``:
  ``DOCTOR_MARKER``
- files in the directory the sbatch script hands each launcher (``--marks-dir``):
  ``node<R>.started`` and ``node<R>.exit`` (``write_mark``; the script reads them by the
  names ``mark_name`` gives); between the launchers of one srun step, ``attempt<K>.node<R>.end``
  and node 0's ``attempt<K>.decision`` (``attempt_end_name``, ``decision_name``)
- the other files of ``logs/<run-id>/`` that one process writes and another reads: each
  launcher's event log (``events_name``, ``EVENTS_GLOB``; the SSH head's copies,
  ``events_copy_name``), each rank's files (``rank_file_name``: log, error record, stacks,
  progress file), the launchers' locks (``rank_lock_name``, ``HEAD_LOCK``), the zygote's
  log (``zygote_log_name``), and the nodes' markers without a head (``peer_marker_name``,
  ``PEERS_SEEN_FILE``)
- ``BACKEND_ENV``, launcher -> worker: the backend ``clusterddp.train`` initialises
- the zygote's socket, launcher <-> warm interpreter: one JSON message per frame behind a
  ``FRAME_HEADER`` length (``send_frame`` / ``receive_frame``), descriptors riding on it
- the zipapp's first argument, launcher -> the archive's ``__main__``: ``ZIPAPP_BOOTSTRAP_ARG``,
  ``ZIPAPP_ZYGOTE_ARG``
- a worker's exit status for ``sys.exit(code)``, bootstrap -> launcher (``exit_status``, as
  CPython: the launcher's own exit record says it the same way)

The stub's ``CLUSTERDDP_PROBE`` line is the one exception: the stub (``launch/ssh/stub.py``)
is sent as source to hosts where clusterddp may not be importable, so it spells its marker
itself and the head reads it from there (``stub.PROBE_MARKER``).

Standard library only, and only ``os`` and ``signal`` at import time: the worker bootstrap
loads this file by path in every worker, under whatever interpreter the job names (Python
3.9 or later), so it must stay cheap and must not need clusterddp to be installed.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

if TYPE_CHECKING:
    import socket

#: A remote launcher's last stdout line: its exit code, host, root cause and stop reason.
RESULT_MARKER = b"CLUSTERDDP_RESULT "
#: A launcher's answer to a stacks request (or its own hang): host, why, one summary per rank.
STACKS_MARKER = b"CLUSTERDDP_STACKS "
#: A launcher's ranks' progress files that changed, for the head's straggler check.
PROGRESS_MARKER = b"CLUSTERDDP_PROGRESS "
#: The launcher's human-readable stderr block about a dump; the head keeps it out of the
#: console (its merged report replaces it) and relays it only to the per-host log copy.
REMOTE_BLOCK_HEADER = b"clusterddp: stacks of "
#: A byte on a remote launcher's stdin (from the SSH head): dump every worker's stack.
STACKS_REQUEST_BYTE = b"S"
#: Sent to a run's launcher by ``clusterddp stacks``: the same request, keep running.
STACKS_REQUEST_SIGNAL = signal.SIGRTMIN + 4
#: The signals a launcher (``launch/supervise/supervisor.py``) and the SSH head (``launch/ssh/fanout.py``)
#: turn into an orderly stop of the job, exit 128+N (like torchrun's --signals-to-handle).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: What the stop byte on a remote launcher's stdin says the head received.
_STOP_BYTES = {signal.SIGINT: b"I", signal.SIGTERM: b"T", signal.SIGHUP: b"H", signal.SIGQUIT: b"Q"}
#: Real-time signal the worker bootstrap arms for stack dumps (SIGUSR1/2 belong to the script).
DUMP_SIGNAL = signal.SIGRTMIN + 3
#: The file a worker's bootstrap appends its faulthandler dumps to.
STACKS_FILE_ENV = "CLUSTERDDP_STACKS_FILE"
#: The file ``clusterddp.train.heartbeat()`` touches; the hang detector reads its mtime.
HEARTBEAT_FILE_ENV = "CLUSTERDDP_HEARTBEAT_FILE"
#: Every worker's environment carries ``SUPERVISOR_ID_ENV=<token>``: the reaper finds the
#: job's processes by it, even ones that left every process group.
SUPERVISOR_ID_ENV = "CLUSTERDDP_SUPERVISOR_ID"
#: ``logs/<run-id>/launcher.json``: the process that answers ``clusterddp stacks`` for the run.
LAUNCHER_FILE = "launcher.json"
#: The doctor's worker prints one line with this marker and its measurements as JSON.
DOCTOR_MARKER = "CLUSTERDDP_DOCTOR "
#: ``--marks-dir DIR`` (the sbatch script's directory for one attempt): a launcher writes
#: ``DIR/node<R>.started`` once it knows its node rank R and ``DIR/node<R>.exit`` (its exit
#: status, digits) when it ends. srun exits 0 when no task launched (a SPANK plugin failing in
#: the step), so the script reads these instead of trusting srun's status alone.
MARK_STARTED = "started"
MARK_EXIT = "exit"
#: ``T_MS ATTEMPT restart|stop TEXT``: a node's first failure and its restart verdict
#: (clusterddp.launch.restart.stepcoord writes it, the sbatch script's ``launchers_failure`` reads it).
MARK_FAILURE = "failure"
#: The attempt a launcher restarted in place runs now: the script's count goes on from it.
MARK_ATTEMPT = "attempt"
#: Where ``clusterddp.train`` finds the backend the launcher chose (``gloo``, ``nccl``...).
BACKEND_ENV = "CLUSTERDDP_BACKEND"
#: The zipapp's first argument that makes it a worker's bootstrap instead of the CLI
#: (``clusterddp pack`` writes the archive's ``__main__``, ``bootstrap.command`` the argv).
ZIPAPP_BOOTSTRAP_ARG = "--clusterddp-bootstrap"
#: The zipapp's first argument that makes it a node's warm interpreter (``warm.zygote_command``).
ZIPAPP_ZYGOTE_ARG = "--clusterddp-zygote"


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` ends a process with, as CPython's ``_Py_HandleSystemExit``:
    None 0; an int (bools and int subclasses too) through ``PyLong_AsLong``, so one past a C
    long is -1, exit 255 (never its low 8 bits: ``2**63 & 0xFF`` would be 0); anything else 1
    (Python prints it to stderr first: the caller's part). A worker's bootstrap ends with it;
    the launcher's exit record says its own ``SystemExit`` the same way."""
    if code is None:
        return 0
    if isinstance(code, int):
        # compared, not ``in range(...)``: that walks the range for an int subclass
        return (int(code) if _C_LONG_MIN <= code <= _C_LONG_MAX else -1) & 0xFF
    return 1


#: A C long (LP64): what ``PyLong_AsLong`` takes without an OverflowError.
_C_LONG_MIN, _C_LONG_MAX = -(1 << 63), (1 << 63) - 1


def worker_stop_signal(received: int | None) -> int:
    """The signal that starts the workers' orderly stop when the launcher got ``received``
    (None: a failure, a hang, a lost head): SIGINT stays SIGINT, so a script's ``except
    KeyboardInterrupt`` runs on Ctrl-C as under ``python`` or torchrun; SIGTERM for the
    others (SIGHUP's and SIGQUIT's default actions would end a worker without its cleanup,
    SIGQUIT's with a core dump)."""
    return signal.SIGINT if received == signal.SIGINT else signal.SIGTERM


def stop_request_byte(signum: int) -> bytes:
    """The byte the head writes to a launcher's stdin before EOF when it stops on ``signum``."""
    return _STOP_BYTES[signal.Signals(signum)]


def stop_requested(chunk: bytes) -> int | None:
    """The stop signal a chunk of a launcher's stdin carries, None when it carries none."""
    for signum, byte in _STOP_BYTES.items():
        if byte in chunk:
            return int(signum)
    return None


def end_attempt_word(attempt: int) -> bytes:
    """``E<K>\n``: the head tells a launcher that waits for its word (``--await-restart``) to
    end attempt K (another host failed): tear down its workers, report, wait. The attempt's
    number makes a late word harmless: it never ends the next attempt."""
    return f"{_END_ATTEMPT}{attempt}\n".encode()


def restart_word(attempt: int, master_port: int, layout: tuple[int, Sequence[int]] | None = None,
                 master_addr: str | None = None) -> bytes:
    """``R<K> <P>\n``: the head tells a waiting launcher to run attempt K in place, its workers
    on master port P, forked from the interpreter it kept. ``layout``: the job's nodes changed
    (an elastic job lost a host): this launcher's new node rank and every node's workers, in
    node-rank order, as ``R<K> <P> <NODE_RANK> <W0>,<W1>,...``, then `` <ADDR>`` when node 0
    was lost and the master moved with it."""
    if layout is None:
        return f"{_RESTART}{attempt} {master_port}\n".encode()
    node_rank, workers = layout
    moved = f" {master_addr}" if master_addr is not None else ""
    return f"{_RESTART}{attempt} {master_port} {node_rank} {','.join(str(w) for w in workers)}{moved}\n".encode()


class RestartWord(NamedTuple):
    """What a restart word says: the attempt, its master port, and the node's new place when
    the job's nodes changed (None / empty: the same place). A NamedTuple, not a dataclass:
    the workers' bootstrap loads this file without registering it as a module."""

    attempt: int
    master_port: int
    node_rank: int | None = None
    #: Every node's workers in node-rank order (the node count is its length).
    node_workers: tuple[int, ...] = ()
    #: The master's new address, when node 0 was lost; None: the same.
    master_addr: str | None = None


_END_ATTEMPT = "E"
_RESTART = "R"
#: The longest word read (a restart word lists every node's workers: 100,000 nodes fit).
MAX_WORD = 1 << 20


def _read_word(word: bytes) -> tuple[str, int, RestartWord | None] | None:
    """``E<K>``, ``R<K> <P>`` or ``R<K> <P> <NODE_RANK> <W0,W1,...>[ <ADDR>]`` (without the
    newline) as ("end", K, None) / ("restart", K, RestartWord); None for anything else."""
    kind, parts = word[:1], word[1:].split(b" ")
    numbers = parts[:3]
    if not all(n.isdigit() and len(n) <= 9 for n in numbers):
        return None
    if kind == _END_ATTEMPT.encode() and len(parts) == 1:
        return "end", int(numbers[0]), None
    if kind != _RESTART.encode() or len(parts) not in (2, 4, 5) or not 0 < int(numbers[1]) < 65536:
        return None
    attempt, port = int(numbers[0]), int(numbers[1])
    if len(parts) == 2:
        return "restart", attempt, RestartWord(attempt, port)
    workers = parts[3].split(b",")
    if not all(w.isdigit() and len(w) <= 9 and int(w) > 0 for w in workers) or int(numbers[2]) >= len(workers):
        return None
    addr = parts[4] if len(parts) == 5 else None
    if addr is not None and not (0 < len(addr) <= 253 and all(chr(c) in _ADDRESS_CHARS for c in addr)):
        return None
    return "restart", attempt, RestartWord(attempt, port, int(numbers[2]), tuple(int(w) for w in workers),
                                           addr.decode() if addr is not None else None)


#: What a master address in a restart word may hold: a host name, IPv4 or IPv6 (with a zone).
_ADDRESS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:%")


class StdinWords:
    """Reads a remote launcher's stdin stream, chunk by chunk, into what the head said: the
    single bytes (keepalive newline, stacks request, stop byte) act at once; a word (a letter,
    numbers, a newline) may be split across chunks and acts once whole. A word that does not
    parse, or is longer than ``MAX_WORD``, is dropped: a head of another version must not stop
    a launcher by accident."""

    def __init__(self) -> None:
        self._word: bytearray | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, int, RestartWord | None]]:
        """What ``chunk`` says, in order: ``("stop", signum, None)``, ``("stacks", 0, None)``,
        ``("end", K, None)``, ``("restart", K, RestartWord)``; keepalives say nothing."""
        said: list[tuple[str, int, RestartWord | None]] = []
        at = 0
        while at < len(chunk):
            if self._word is not None:
                end = chunk.find(b"\n", at)
                piece = chunk[at:] if end < 0 else chunk[at:end]
                if len(self._word) <= MAX_WORD:
                    self._word += piece[:MAX_WORD + 1 - len(self._word)]
                if end < 0:
                    break
                at = end + 1
                word = _read_word(bytes(self._word)) if len(self._word) <= MAX_WORD else None
                self._word = None
                if word is not None:
                    said.append(word)
                continue
            byte = chunk[at:at + 1]
            at += 1
            if byte in (b"E", b"R"):
                self._word = bytearray(byte)
            elif byte == STACKS_REQUEST_BYTE:
                said.append(("stacks", 0, None))
            elif byte != b"\n":
                signum = stop_requested(byte)
                if signum is not None:
                    said.append(("stop", signum, None))
        return said


# -- lines on a remote launcher's stdout -------------------------------------------------------

def restart_marker(attempt: int) -> bytes:
    """The line between attempts in a log a restart appends to (a rank's, the head's copy of a
    host's): ``--- clusterddp: restart K (TORCHELASTIC_RESTART_COUNT=K) at <time> ---``."""
    return (f"--- clusterddp: restart {attempt} (TORCHELASTIC_RESTART_COUNT={attempt}) at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n").encode()


def result_line(exit_code: int, host: str, root_cause: dict[str, object] | None, reason: str | None,
                progressed: bool | None = None, waiting_after: int | None = None,
                ranks: Sequence[dict[str, object]] = ()) -> str:
    """The ``CLUSTERDDP_RESULT`` line a launcher started by the head prints at its end.

    ``root_cause`` carries the failed worker's exit, signal and last lines (its traceback);
    ``progressed``: did any of this host's ranks complete a step in the attempt (None: not
    known). With them the head applies the restart verdict (``launch/restart/verdict.py``) to the
    whole job exactly as a launcher alone applies it to its group. ``waiting_after``: the
    attempt that just failed, when the launcher (``--await-restart``) now waits for the head's
    word instead of ending (``"waiting": true``). ``ranks``: how each of its ranks ended
    (``verdict.RankEnd``), so the head judges a failure from every rank of the job."""
    import json

    result: dict[str, object] = {"exit_code": exit_code, "host": host, "root_cause": root_cause, "reason": reason,
                                 "progressed": progressed}
    if waiting_after is not None:
        result.update(attempt=waiting_after, waiting=True)
    if ranks:
        result["ranks"] = list(ranks)
    return RESULT_MARKER.decode() + json.dumps(result)


def parse_result(line: bytes) -> dict[str, object]:
    """The payload of a ``CLUSTERDDP_RESULT`` line; ValueError when it is not one or unreadable."""
    return _payload(line, RESULT_MARKER)


def stacks_line(host: str, why: str, ranks: dict[int, str], waiting: list[int], full: str | None) -> str:
    """The ``CLUSTERDDP_STACKS`` line: where each rank is (one summary per rank), the ranks
    waiting in a collective, and where the full dump was kept."""
    import json

    data = {"host": host, "why": why, "ranks": ranks, "waiting": waiting, "full": full}
    return STACKS_MARKER.decode() + json.dumps(data)


def parse_stacks(line: bytes) -> dict[str, object]:
    """The payload of a ``CLUSTERDDP_STACKS`` line; ValueError when it is not one or unreadable."""
    return _payload(line, STACKS_MARKER)


def progress_line(host: str, records: list[tuple[int, float, str]]) -> str:
    """The ``CLUSTERDDP_PROGRESS`` line: (rank, the file's mtime, the record's JSON text as the
    rank wrote it) of each record that changed; the head reads each with ``progress.parse_record``."""
    import json

    return PROGRESS_MARKER.decode() + json.dumps({"host": host, "records": records}, separators=(",", ":"))


def parse_progress(line: bytes) -> dict[str, object]:
    """The payload of a ``CLUSTERDDP_PROGRESS`` line; ValueError when it is not one or unreadable."""
    return _payload(line, PROGRESS_MARKER)


def stacks_block_title(workers: int, host: str, why: str) -> str:
    """The first line of a launcher's stderr block about a dump (see ``REMOTE_BLOCK_HEADER``)."""
    return f"{REMOTE_BLOCK_HEADER.decode()}{workers} worker(s) on {host} ({why}):"


def _payload(line: bytes, marker: bytes) -> dict[str, object]:
    import json

    if not line.startswith(marker):
        raise ValueError(f"not a {marker.decode().strip()} line")
    data = json.loads(line[len(marker):])
    if not isinstance(data, dict):
        raise ValueError(f"{marker.decode().strip()}: expected a JSON object")
    return data


# -- the zygote's socket -----------------------------------------------------------------------

#: A frame on the zygote's socket: this ``struct`` header (a 4-byte big-endian length), then
#: that much JSON; descriptors (SCM_RIGHTS) ride on the header's bytes.
FRAME_HEADER = "!I"


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One frame of ``message``, with ``fds`` on its first bytes (launcher and zygote alike)."""
    import json
    import socket
    import struct

    body = json.dumps(message).encode()
    header = struct.pack(FRAME_HEADER, len(body))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(body)


def receive_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One frame and the descriptors that came with it; (None, []) at EOF."""
    import json
    import socket
    import struct

    size_of = struct.calcsize(FRAME_HEADER)
    header, fds, _flags, _addr = socket.recv_fds(sock, size_of, max_fds) if max_fds \
        else (sock.recv(size_of), [], 0, None)
    while header and len(header) < size_of:
        more = sock.recv(size_of - len(header))
        if not more:
            break
        header += more
    if len(header) < size_of:
        for fd in fds:
            os.close(fd)
        return None, []
    (size,) = struct.unpack(FRAME_HEADER, header)
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None, fds
        chunks.append(chunk)
        size -= len(chunk)
    return json.loads(b"".join(chunks)), fds


# -- files in the run's log directory ----------------------------------------------------------

#: The run owner's event log (a launcher alone, or the SSH head): ``clusterddp.events``.
EVENTS_FILE = "events.jsonl"
#: Every event log of a run directory, which ``clusterddp report`` merges by time.
EVENTS_GLOB = "events*.jsonl"
#: The SSH head's lock beside its launchers' rank locks: one head per run id.
HEAD_LOCK = ".head.lock"
#: Node 0's acknowledgement, without a head: whose progress files it reads, by their markers.
PEERS_SEEN_FILE = "node0.sees"
#: What each rank leaves in the run directory (``rank_file_name``): its output, torch
#: elastic's error record (``TORCHELASTIC_ERROR_FILE``), its stack dumps (``STACKS_FILE_ENV``)
#: and its progress file (``HEARTBEAT_FILE_ENV``; node 0 reads other nodes' by name).
RANK_LOG = "log"
RANK_ERROR = "error.json"
RANK_STACKS = "stacks"
RANK_HEARTBEAT = "heartbeat"


def events_name(node: int | str | None) -> str:
    """The event log's name for its writer: ``events.jsonl`` for the run's owner (``node``
    None), ``events.node<K>.jsonl`` for node K of a multi-node run (one writer per file:
    appends from several hosts to one file are not atomic on a shared filesystem)."""
    return EVENTS_FILE if node is None else f"events.node{node}.jsonl"


def events_copy_name(node: int | str, host: str) -> str:
    """``events.node<K>.<host>.jsonl``: the SSH head's copy of node K's log from ``host`` (a
    node rank may move to another host after a restart, so the host is part of the name)."""
    import re

    return f"events.node{node}.{re.sub(r'[^A-Za-z0-9._-]', '_', host)}.jsonl"


def rank_file_name(rank: int | str, kind: str) -> str:
    """``rank<R>.<kind>``, one of the ``RANK_*`` kinds."""
    return f"rank{rank}.{kind}"


def rank_lock_name(rank: int | str) -> str:
    """``.rank<R>.lock``: the launcher that runs rank R holds it (two launchers of one run id
    never run the same rank)."""
    return f".rank{rank}.lock"


def zygote_log_name(node: int | str) -> str:
    """``zygote.node<K>.log``: the warm interpreter's stderr, beside its node's rank logs."""
    return f"zygote.node{node}.log"


def peer_marker_name(node: int | str) -> str:
    """``node<K>.here``: node K's marker, without a head, naming its ranks' progress files
    for node 0 (``launch/observe/peers.py``)."""
    return f"node{node}.here"


def write_launcher_file(run_dir: str | os.PathLike[str], host: str, run_id: str, ranks: list[int],
                        hosts: list[str] | None = None) -> None:
    """``<run_dir>/launcher.json`` naming this process, so ``clusterddp stacks`` signals it.

    Written whole (clusterddp.atomicfile). The SSH head adds ``hosts``; launchers it starts
    (--watch-stdin) never write it, so on a shared filesystem the file keeps naming the
    process that answers for all hosts. A failed write is not an error: the job matters more.
    """
    import json

    from clusterddp.procid import this_process

    me = this_process()
    # pid, start time and boot id together: a stale file's pid may name a stranger by then
    data: dict[str, object] = {**me.as_record(), "host": host, "hostname": me.host, "run_id": run_id,
                               "ranks": list(ranks)}
    if hosts is not None:
        data["hosts"] = list(hosts)
    from clusterddp.atomicfile import WriteError, write_atomically

    try:  # not fsync-ed: it names a live process, worthless after a crash
        write_atomically(os.path.join(os.fspath(run_dir), LAUNCHER_FILE), json.dumps(data), durable=False)
    except WriteError:
        pass


class BadLauncherFile(ValueError):
    """A ``launcher.json`` that cannot be a launcher's record; the message says why."""


#: No launcher writes a record this big; a bigger file is not one (nor read into memory).
LAUNCHER_FILE_MAX_BYTES = 64 * 1024


def read_launcher_file(run_dir: str) -> dict[str, Any] | None:
    """The ``launcher.json`` of ``run_dir``; None when there is none.

    Raises BadLauncherFile for anything a launcher never writes: not a regular file (a FIFO
    would block the read), too big, not UTF-8, not JSON (or nested past the parser's depth),
    not an object. Its pid is not checked here: ``clusterddp.procid`` does that.
    """
    import json

    from clusterddp.validate import read_small_file

    path = os.path.join(run_dir, LAUNCHER_FILE)
    if not os.path.lexists(path):
        return None
    try:
        raw = read_small_file(path, LAUNCHER_FILE_MAX_BYTES)
    except ValueError as exc:
        raise BadLauncherFile(str(exc)) from None
    except OSError as exc:
        raise BadLauncherFile(f"cannot be read ({exc.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadLauncherFile("is not UTF-8 text") from None
    except RecursionError:
        raise BadLauncherFile("is nested too deeply") from None
    except ValueError as exc:
        raise BadLauncherFile(f"is not JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise BadLauncherFile("is not a JSON object")
    return data


def launcher_files(log_dir: str) -> list[str]:
    """Every run's ``launcher.json`` under ``log_dir``, newest first."""
    import glob

    def modified(path: str) -> float:
        try:  # lstat: a link to a FIFO or /dev/zero is not followed; a file gone since: last
            return os.lstat(path).st_mtime
        except OSError:
            return float("-inf")

    return sorted(glob.glob(os.path.join(glob.escape(log_dir), "*", LAUNCHER_FILE)), key=modified, reverse=True)


def write_stacks_report(text: str, directory: str | os.PathLike[str]) -> str:
    """``stacks-<time>-<pid>.txt`` in the run's log dir, written whole or not at all
    (clusterddp.atomicfile; raises its WriteError); return its path. The name is what
    ``clusterddp stacks`` waits for (``stacks_reports``), the pid telling this process's report
    from other hosts' dumps on a shared filesystem."""
    import time
    from pathlib import Path

    folder = Path(directory)
    base = f"stacks-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path = folder / f"{base}.txt"
    n = 1
    while path.exists():
        path = folder / f"{base}.{n}.txt"
        n += 1
    from clusterddp.atomicfile import write_atomically

    write_atomically(path, text)
    return str(path)


def stacks_reports(run_dir: str, pid: int) -> set[str]:
    """Reports written by the launcher ``pid``: ``stacks-<date>-<time>-<pid>[.N].txt``.

    Only that launcher's: on a shared filesystem the hosts of an SSH run dump into the same
    directory, and their per-host files must not be mistaken for the head's merged report.
    """
    import glob
    import re

    pattern = re.compile(rf"^stacks-\d{{8}}-\d{{6}}-{pid}(\.\d+)*\.txt$")
    return {path for path in glob.glob(os.path.join(run_dir, "stacks-*.txt"))
            if pattern.match(os.path.basename(path))}


# -- files in the batch script's record directory ----------------------------------------------

def mark_name(node_rank: int | str, kind: str) -> str:
    """``node<R>.<kind>``; the renderer passes the shell's ``$i`` as ``node_rank`` so the sbatch
    script reads exactly the names the launcher writes."""
    return f"node{node_rank}.{kind}"


def attempt_end_name(attempt: int | str, node: int | str) -> str:
    """``attempt<K>.node<R>.end``: how node R's attempt K ended, for node 0's decision on a
    restart in place (``launch/restart/stepcoord.py``)."""
    return f"attempt{attempt}.node{node}.end"


def decision_name(attempt: int | str) -> str:
    """``attempt<K>.decision``: node 0's decision after attempt K, which the other nodes poll for."""
    return f"attempt{attempt}.decision"


def write_mark(directory: str, node_rank: int, kind: str, text: str) -> None:
    """``directory/node<R>.<kind>``, written whole (clusterddp.atomicfile; raises its
    WriteError): the batch shell on another node never reads half an exit status."""
    from clusterddp.atomicfile import WriteError, write_atomically

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise WriteError(directory, exc.strerror or type(exc).__name__) from None
    write_atomically(os.path.join(directory, mark_name(node_rank, kind)), text, durable=False)

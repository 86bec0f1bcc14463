"""The one set of rules every value obeys, wherever it enters: job file, flags,
``CLUSTERDDP_*`` variables, hostfile, token files, the cluster's variables.

Each check is a pure function ``value -> problem | None`` (the protocol of
``specload.check``), so the YAML loader, the CLI and the environments share it. Grammars use
``fullmatch``: ``re.match`` with ``$`` admits a trailing newline, which is how ``name:
"hello\\n"`` once got through. Every echoed value goes through ``shown`` so that a 50 MB field
never becomes a 50 MB error line, and a control character never reaches the terminal raw.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import signal
import stat
import unicodedata
from typing import Mapping

#: A job file is a regular file of at most this many bytes (a FIFO would hang the reader,
#: /dev/zero would fill memory).
MAX_JOB_FILE_BYTES = 1 << 20
#: One string value (an argument, an env value, a path) at most this many characters; Linux
#: refuses a single exec argument over 128 KiB (E2BIG) anyway.
MAX_VALUE_CHARS = 64 << 10
#: Names and run ids: plain tokens of at most this many characters.
MAX_TOKEN_CHARS = 128
#: Workers on one node unless ``CLUSTERDDP_MAX_WORKERS_PER_NODE`` raises the bound.
MAX_WORKERS_PER_NODE = 256
MAX_WORKERS_ENV = "CLUSTERDDP_MAX_WORKERS_PER_NODE"
#: Nodes of one job (a typo like 10**26 must not become a loop or a 700 MB dry run).
MAX_NODES = 65536
#: Characters of a value echoed in an error line.
ECHO_CHARS = 80
#: Characters of one error line (its values are cut to ``ECHO_CHARS`` where it is built;
#: this is the bound for a message that quotes a tool or argparse whole).
MAX_ERROR_CHARS = 1000

TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Signals the launcher needs for itself: stopping the job, children, the stacks request.
_RESERVED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGCHLD")
#: Cannot be caught, or stop the process (a stopped launcher supervises nothing), or are
#: synchronous faults whose handler would loop.
_UNUSABLE_SIGNALS = ("SIGKILL", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU",
                     "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGPIPE")


def shown(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr`` of a value for an error line: control characters escaped, cut to ``limit``."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 2 else text[:limit] + "...'"


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as it may be printed (a run id, a context, a path, a line from a file the user
    did not write): control characters escaped (``\\x1b``), cut to about ``limit`` characters
    with the full length said. Unlike ``shown``, no quotes: for text inside a sentence."""
    if len(text) > limit:
        return f"{escape_controls(text[:limit])}... ({len(text)} characters)"
    return escape_controls(text)


def is_control(char: str) -> bool:
    """C0/C1 controls, DEL, and the Unicode line and paragraph separators, BOM and bidi
    overrides: anything that can end a line, hide text or move the cursor."""
    category = unicodedata.category(char)
    return category in ("Cc", "Zl", "Zp") or (category == "Cf" and char != "\u200d")


def control_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name, path or single line; None when it can."""
    for index, char in enumerate(value):
        if char == "\0":
            return f"contains a NUL byte at character {index}"
        if is_control(char):
            return f"contains the control character {char!r} at character {index}"
    return None


def text_problem(value: str, limit: int = MAX_VALUE_CHARS) -> str | None:
    """Free text (an argument, an env value): no NUL (exec would refuse it), bounded size."""
    if "\0" in value:
        return f"contains a NUL byte at character {value.index(chr(0))}"
    if len(value) > limit:
        return f"is {len(value)} characters long (at most {limit})"
    return None


def line_problem(value: str, limit: int = MAX_VALUE_CHARS) -> str | None:
    """One line of text (a path, a shell line, an interpreter): bounded, no control characters."""
    if len(value) > limit:
        return f"is {len(value)} characters long (at most {limit})"
    return control_problem(value)


def token_problem(value: str, what: str = "a name") -> str | None:
    """Names and run ids: letters, digits, '_', '.', '-', starting with a letter or digit."""
    if len(value) > MAX_TOKEN_CHARS:
        return f"{what} of at most {MAX_TOKEN_CHARS} characters, got {len(value)}"
    if TOKEN.fullmatch(value) and value not in (".", ".."):
        return None
    return f"must be {what} of letters, digits, '_', '.', '-' (starting with a letter or digit), got {shown(value)}"


def env_name_problem(name: str) -> str | None:
    if len(name) <= MAX_TOKEN_CHARS and ENV_NAME.fullmatch(name):
        return None
    return f"invalid environment variable name {shown(name)}"


def port_problem(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"port must be 1-65535, got {value}"


def positive_problem(value: float) -> str | None:
    if value != value or value in (float("inf"), float("-inf")):
        return f"must be a finite number, got {value}"
    return None if value > 0 else f"must be > 0, got {value}"


def non_negative_problem(value: float) -> str | None:
    if value != value or value in (float("inf"), float("-inf")):
        return f"must be a finite number, got {value}"
    return None if value >= 0 else f"must be >= 0, got {value}"


def max_workers_per_node(env: "os._Environ[str] | dict[str, str] | None" = None) -> int:
    """The bound on workers per node; ``CLUSTERDDP_MAX_WORKERS_PER_NODE`` raises it."""
    raw = (os.environ if env is None else env).get(MAX_WORKERS_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_WORKERS_PER_NODE


def workers_problem(value: int) -> str | None:
    if value < 1:
        return f"must be >= 1, got {value}"
    bound = max_workers_per_node()
    if value > bound:
        return (f"{value} workers on one node is over the bound of {bound} "
                f"(set {MAX_WORKERS_ENV} to go past it)")
    return None


def nodes_problem(value: int) -> str | None:
    if value < 1:
        return f"must be > 0, got {value}"
    return None if value <= MAX_NODES else f"{value} nodes is over the bound of {MAX_NODES}"


#: ``nodes: "MIN:MAX"`` as torchrun's ``--nnodes``: digits only, each bounded like a count.
NODE_RANGE = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")


def parse_node_range(value: int | str) -> tuple[int, int]:
    """``4`` -> (4, 4); ``"3:4"`` -> (3, 4). Raises ValueError naming the problem."""
    if isinstance(value, int) and not isinstance(value, bool):
        problem = nodes_problem(value)
        if problem:
            raise ValueError(problem)
        return value, value
    match = NODE_RANGE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected an integer or 'MIN:MAX' (like torchrun's --nnodes 3:4), "
                         f"got {type(value).__name__} {shown(value)}")
    low, high = int(match.group(1)), int(match.group(2))
    for count in (low, high):
        problem = nodes_problem(count)
        if problem:
            raise ValueError(problem)
    if low > high:
        raise ValueError(f"MIN {low} is more than MAX {high} in {shown(value)}")
    return low, high


def node_range_problem(value: int | str) -> str | None:
    try:
        parse_node_range(value)
    except ValueError as exc:
        return str(exc)
    return None


def signal_problem(name: str) -> str | None:
    """A signal the launcher can forward to workers: known, catchable, not a stop signal,
    and not one the launcher needs for itself."""
    if not isinstance(name, str) or not name.startswith("SIG") or name.startswith(("SIG_", "SIGRT")):
        return f"unknown signal {shown(name)} (use names like SIGUSR1)"
    if not isinstance(getattr(signal, name, None), signal.Signals):
        return f"unknown signal {shown(name)} (use names like SIGUSR1)"
    if name in _UNUSABLE_SIGNALS:
        return f"{name} cannot be forwarded: it cannot be caught, stops the process, or is a fault"
    if name in _RESERVED_SIGNALS:
        return f"{name} stops the job (or is the launcher's own): it cannot also be forwarded"
    return None


# --- The cluster's variables (clusterddp/envs): a scheduler's value is input like any other.

#: A host name (RFC 1123 labels; '_' allowed, as SLURM node names have it) or an IP address.
MAX_HOST_CHARS = 253
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
#: The characters of an IPv4/IPv6 address, with an optional zone (``fe80::1%eth0``).
_IP_TEXT = re.compile(r"[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?")
#: Counts and indexes read from the cluster's variables (restart counts, CPUs per task).
MAX_COUNT = 1 << 20
#: A decimal integer as a scheduler writes it: ASCII digits, an optional '-', no blanks, no
#: '+', no '_' and no Unicode digits (``int(" 3\n")``, ``int("1_0")`` and ``int("٣")`` all
#: succeed, which is how a wrong value slips through).
INTEGER_TEXT = re.compile(r"-?[0-9]{1,19}")
#: An id the cluster chose (``alice~job``, a SLURM job id) before it becomes a run id.
MAX_ID_CHARS = 1024
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")


def host_problem(value: str) -> str | None:
    """A master address: an IP address or a host name of at most 253 characters; no blanks,
    control characters, or leading '-' (it would read as an option to srun or ssh)."""
    if len(value) <= MAX_HOST_CHARS and HOST_NAME.fullmatch(value):
        return None
    if not _IP_TEXT.fullmatch(value):
        return f"expected a host name or IP address, got {shown(value)}"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        return f"expected a host name or IP address, got {shown(value)}"


def int_text_problem(raw: str, low: int, high: int) -> str | None:
    """Why ``raw`` is not a strict decimal integer in ``low..high``; None when it is."""
    if not INTEGER_TEXT.fullmatch(raw) or not low <= int(raw) <= high:
        return f"expected an integer from {low} to {high}, got {shown(raw)}"
    return None


def id_problem(value: str) -> str | None:
    """An id the cluster chose, before ``as_token``: one bounded line."""
    if len(value) > MAX_ID_CHARS:
        return f"is {len(value)} characters long (at most {MAX_ID_CHARS})"
    return control_problem(value)


def as_token(value: str) -> str:
    """A run id made from an id the cluster chose, identical on every node: characters outside
    the token grammar become '_' (``alice~job`` -> ``alice_job``), a leading one gets an 'x'
    before it, and an id over the token bound is cut and ends with a hash of the whole id."""
    token = _NOT_TOKEN.sub("_", value)
    if not token[:1].isalnum():
        token = "x" + token
    if len(token) > MAX_TOKEN_CHARS:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        token = f"{token[:MAX_TOKEN_CHARS - 13]}-{digest}"
    return token


#: A bearer token or other secret read from a file or a variable: at most this many characters.
MAX_SECRET_CHARS = 16 << 10


def one_line_problem(value: str, limit: int = MAX_VALUE_CHARS) -> str | None:
    """A shell line by design (``slurm.setup``): exactly one line, so tabs are fine but no line
    break of any kind (LF, CR, VT, FF, NEL, U+2028/9) nor any other control character."""
    return line_problem(value.replace("\t", " "), limit)


def setup_line_problem(line: str) -> str | None:
    """An entry of ``slurm.setup`` / ``openpai.setup``: one shell line."""
    problem = one_line_problem(line)
    return f"one shell line per entry: {problem}" if problem else None


def secret_problem(value: str, limit: int = MAX_SECRET_CHARS) -> str | None:
    """A token: one line of visible ASCII, bounded. The problem never quotes the value."""
    if not value:
        return "is empty"
    if len(value) > limit:
        return f"is {len(value)} characters long (at most {limit})"
    for index, char in enumerate(value):
        if char in "\r\n\v\f\x85\u2028\u2029":
            return f"has a line break at character {index}: a token is one line"
        if not ("\x21" <= char <= "\x7e"):
            return f"has a character that is not visible ASCII at character {index} (a blank, a control character)"
    return None


# --- Files, paths and exec: the job file, the hostfile, what a worker is started with.

#: YAML nesting a job file may use (the schema needs 4); deeper is an attack on the parser's
#: recursion, not a job.
MAX_YAML_DEPTH = 32
#: A hostfile is a regular file of at most this many bytes (100k hosts of 10 characters).
MAX_HOSTFILE_BYTES = 1 << 20
#: Linux refuses one argv or environment string over 32 pages (MAX_ARG_STRLEN) with E2BIG.
MAX_ARG_STRLEN = 32 * 4096
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def read_small_file(path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Opened without blocking and
    checked on the open descriptor, so a FIFO cannot hang the reader and /dev/zero cannot fill
    memory. Raises ValueError(problem) for the wrong kind or size, OSError as the OS says."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ValueError(f"is {kind} (expected a regular file of at most {limit} bytes)")
        if info.st_size > limit:
            raise ValueError(f"is {info.st_size} bytes (at most {limit})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while we read it
            raise ValueError(f"is over {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json_object(path: str, limit: int) -> dict[str, object] | None:
    """The JSON object a small regular file holds (``read_small_file``); None when there is
    none, it cannot be read, or it is not one: a record another process writes whole
    (``atomicfile``) and this one polls for, where absent and unreadable mean "not yet"."""
    import json

    try:
        data = json.loads(read_small_file(path, limit))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def path_problem(value: str) -> str | None:
    """A file or directory name as written in a job or a flag: one non-empty bounded line."""
    if not value:
        return "must not be empty"
    return line_problem(value)


def module_problem(value: str) -> str | None:
    """``module:``: a dotted Python module name, as ``python -m`` takes it."""
    if len(value) <= MAX_TOKEN_CHARS * 4 and MODULE.fullmatch(value):
        return None
    return f"expected a dotted Python module name like 'pkg.train', got {shown(value)}"


def exec_size_problem(argv: "list[str] | tuple[str, ...]", env: "Mapping[str, str]") -> str | None:
    """Why exec would refuse this argv + environment with E2BIG; None when it fits. Names the
    argument or variable at fault, never its value."""
    total = 0
    for index, arg in enumerate(argv):
        size = len(os.fsencode(arg)) + 1
        if size > MAX_ARG_STRLEN:
            return f"argument {index} is {size - 1} bytes (exec refuses one over {MAX_ARG_STRLEN - 1})"
        total += size + 8
    for key, value in env.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2
        if size > MAX_ARG_STRLEN:
            return f"variable {shown(key)} is {size - 2} bytes (exec refuses one over {MAX_ARG_STRLEN - 2})"
        total += size + 8
    limit = os.sysconf("SC_ARG_MAX") if hasattr(os, "sysconf") else 2 << 20
    if total > limit - 4096:
        return f"arguments and environment take {total} bytes (exec refuses over {limit - 4096})"
    return None


def escape_controls(text: str) -> str:
    """A message made one line: each control character written as its escape (``\\n``)."""
    if not any(is_control(c) for c in text):
        return text
    return "".join(repr(c)[1:-1] if is_control(c) else c for c in text)


#: Durations (grace period, hang timeout, connect timeout) at most this many seconds (~115
#: days): past threading.TIMEOUT_MAX a wait raises OverflowError mid-teardown.
MAX_SECONDS = 10_000_000


def seconds_problem(value: float, zero_ok: bool = True) -> str | None:
    """A duration in seconds: finite, >= 0 (> 0 unless ``zero_ok``), at most MAX_SECONDS."""
    problem = non_negative_problem(value) if zero_ok else positive_problem(value)
    if problem is None and value > MAX_SECONDS:
        return f"must be at most {MAX_SECONDS} seconds, got {value}"
    return problem


def positive_seconds_problem(value: float) -> str | None:
    """A duration that must be > 0 (a timeout)."""
    return seconds_problem(value, zero_ok=False)

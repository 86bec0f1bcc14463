"""The run registry: one small JSON file per run under one directory, so a run can be listed,
followed and stopped after the terminal that started it is gone.

Where: ``$CLUSTERDDP_HOME`` when set (one variable moves everything), else
``$XDG_STATE_HOME/clusterddp``, else ``~/.local/state/clusterddp``. The records are *state*
in the XDG sense (like a shell's history: kept across restarts, not worth a backup, not
configuration), so they go where the user's other tools keep theirs, not in a new dot
directory in ``$HOME``. Records sit in ``<home>/runs/<run-id>.json``.

Written whole (``atomicfile``: a temporary file renamed over the record), so a reader never
sees half a record, and two ``clusterddp`` commands never mix their bytes. A change to an
existing record (the run's end, a refreshed state, a stop asked for) is a read-modify-write
under an ``flock`` of ``<home>/runs/.lock``: two commands updating one record at once both
land. Reading takes no lock.

A record never holds a secret: no environment, no command line, only names, paths, hosts, ids
and numbers, and every text field passes ``redact.scrub`` before it is written. A record that
cannot be read (half-written by a crashed older version, hand-edited, not JSON, too big) is
skipped with one line; listing never fails because one record is bad.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

from clusterddp.atomicfile import WriteError, write_atomically
from clusterddp.errors import ClusterDDPError
from clusterddp.procid import ProcessIdentity
from clusterddp.redact import scrub
from clusterddp.validate import clip, read_small_file, shown, token_problem

HOME_ENV = "CLUSTERDDP_HOME"
RUNS_DIR = "runs"
SUFFIX = ".json"
#: No record is this big; a bigger file is not one (and is not read into memory).
MAX_RECORD_BYTES = 64 * 1024
#: A run id as typed (``clusterddp stop ID``): longer than any id (a token of at most 128
#: characters) is refused before anything is looked up.
MAX_ID_CHARS = 128

#: Where a run runs.
TARGETS = ("local", "ssh", "slurm", "openpai", "k8s")
#: States a record can hold; ``lost`` and ``restarting`` are also derived when listing.
STATES = ("pending", "running", "restarting", "finished", "failed", "stopped", "lost")
#: States after which a record never changes again.
FINAL = frozenset({"finished", "failed", "stopped", "lost"})


def home(env: Mapping[str, str] | None = None) -> Path:
    """The registry's directory (see the module's docstring for the order)."""
    env = os.environ if env is None else env
    given = env.get(HOME_ENV, "")
    if given:
        return Path(given)
    state = env.get("XDG_STATE_HOME", "")
    if state and os.path.isabs(state):
        return Path(state) / "clusterddp"
    return Path(os.path.expanduser("~")) / ".local" / "state" / "clusterddp"


def runs_dir(env: Mapping[str, str] | None = None) -> Path:
    return home(env) / RUNS_DIR


@dataclass
class RunRecord:
    """One run as this machine started it. Plain data: what ``ls``, ``status``, ``logs``,
    ``stop`` and ``attach`` need without asking anyone."""

    run_id: str
    target: str
    job: str
    #: The run's log directory (``<logs.dir>/<run-id>``, absolute as the launcher sees it).
    run_dir: str
    #: The job file (absolute), or empty for ``run -- script``.
    job_file: str = ""
    cwd: str = ""
    #: Hosts (SSH, local: this host), a scheduler's job id, a namespace/context or URL.
    hosts: list[str] = field(default_factory=list)
    job_id: str = ""
    where: str = ""
    state: str = "running"
    #: The process that answers for the run here (local launcher, SSH head); None for a submit.
    launcher: dict[str, Any] | None = None
    started: float = 0.0
    ended: float | None = None
    attempts: int = 1
    exit_code: int | None = None
    root_cause: str = ""
    goodput: float | None = None
    #: ``stop`` was asked: a run that ends now ended because of it.
    stop_requested: float | None = None
    #: The options a scheduler's ``status``/``stop``/``logs`` need again (a URL, a namespace,
    #: a token *file* name; never a token).
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    #: The console of a detached run (a file in the run dir), else empty.
    console: str = ""
    detached: bool = False
    #: A detached SSH run: where its head lives and how to reach it again (host, address, port,
    #: user, key and known_hosts *file names*, the interpreter, its registry and console there).
    head: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> ProcessIdentity | None:
        """The recorded launcher as procid takes it; None when there is none or it is malformed."""
        data = self.launcher
        if not isinstance(data, dict):
            return None
        pid, start, boot, host = (data.get(k) for k in ("pid", "start_time", "boot_id", "host"))
        if type(pid) is not int or not isinstance(host, str):
            return None
        return ProcessIdentity(pid, start if type(start) is int else None, boot if isinstance(boot, str) else None,
                               host)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def launcher_record(identity: ProcessIdentity) -> dict[str, Any]:
    return {**identity.as_record(), "host": identity.host}


def id_problem(run_id: str) -> str | None:
    """Why ``run_id`` as typed cannot name a record (it becomes a file name)."""
    if len(run_id) > MAX_ID_CHARS:
        return f"a run id has at most {MAX_ID_CHARS} characters, got {len(run_id)}"
    return token_problem(run_id, "a run id")


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _scrubbed(v) for k, v in value.items()}
    return value


def _record_path(directory: Path, run_id: str) -> Path:
    problem = id_problem(run_id)
    if problem:
        raise ClusterDDPError(f"run id: {problem}")
    return directory / f"{run_id}{SUFFIX}"


def save(record: RunRecord, env: Mapping[str, str] | None = None) -> None:
    """Write ``record`` whole (a new run, or a change made under ``updating``)."""
    directory = runs_dir(env)
    path = _record_path(directory, record.run_id)
    data = _scrubbed(record.as_json())
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically(path, json.dumps(data, sort_keys=True) + "\n", mode=0o600, durable=False)
    except OSError as exc:
        raise WriteError(str(path), exc.strerror or type(exc).__name__) from None


class _Lock:
    """``flock`` of ``<runs>/.lock`` for one read-modify-write."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __enter__(self) -> "_Lock":
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def update(run_id: str, env: Mapping[str, str] | None = None, **changes: Any) -> RunRecord | None:
    """Change fields of one record under the registry's lock; None when it is gone or bad.
    Best effort for the launch paths: a registry that cannot be written never fails a run."""
    directory = runs_dir(env)
    with _Lock(directory):
        record = _read(_record_path(directory, run_id))
        if record is None:
            return None
        for key, value in changes.items():
            setattr(record, key, value)
        save(record, env)
        return record


class BadRecord(ValueError):
    """A record file that is not a record; the message says why."""


_FIELDS = {f.name: f for f in fields(RunRecord)}
_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "target": (str,), "job": (str,), "run_dir": (str,), "job_file": (str,), "cwd": (str,),
    "hosts": (list,), "job_id": (str,), "where": (str,), "state": (str,), "launcher": (dict, type(None)),
    "started": (int, float), "ended": (int, float, type(None)), "attempts": (int,),
    "exit_code": (int, type(None)), "root_cause": (str,), "goodput": (int, float, type(None)),
    "stop_requested": (int, float, type(None)), "scheduler_options": (dict,), "console": (str,),
    "detached": (bool,), "head": (dict,),
}


def parse(raw: bytes) -> RunRecord:
    """A record from its file's bytes; BadRecord for anything ``save`` never writes."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRecord("is not UTF-8 text") from None
    except RecursionError:
        raise BadRecord("is nested too deeply") from None
    except ValueError as exc:
        raise BadRecord(f"is not JSON ({str(exc)[:60]})") from None
    if not isinstance(data, dict):
        raise BadRecord("is not a JSON object")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _FIELDS:
            continue  # a newer version's field: kept readable
        if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            raise BadRecord(f"{key}: not a {_TYPES[key][0].__name__}")
        values[key] = value
    for key in ("run_id", "target", "job", "run_dir"):
        if key not in values:
            raise BadRecord(f"has no {key}")
    if id_problem(values["run_id"]) or values["target"] not in TARGETS or values.get("state", "running") not in STATES:
        raise BadRecord("names no run this version knows")
    return RunRecord(**values)


def _read(path: Path) -> RunRecord | None:
    try:
        return parse(read_small_file(str(path), MAX_RECORD_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def load_all(env: Mapping[str, str] | None = None) -> tuple[list[RunRecord], list[str]]:
    """Every readable record, newest first, and one line per record skipped."""
    directory = runs_dir(env)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(SUFFIX) and not n.startswith(".")]
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{clip(str(directory), 200)}: cannot list ({exc.strerror})"]
    records: list[RunRecord] = []
    problems: list[str] = []
    for name in names:
        path = directory / name
        try:
            record = parse(read_small_file(str(path), MAX_RECORD_BYTES))
        except FileNotFoundError:
            continue  # removed since the listing
        except OSError as exc:
            problems.append(f"{shown(str(path), 200)}: skipped: cannot be read ({exc.strerror})")
            continue
        except ValueError as exc:
            problems.append(f"{shown(str(path), 200)}: skipped: {clip(str(exc), 120)}")
            continue
        if f"{record.run_id}{SUFFIX}" != name:
            problems.append(f"{shown(str(path), 200)}: skipped: it names run {shown(record.run_id)}")
            continue
        records.append(record)
    records.sort(key=lambda r: (r.started, r.run_id), reverse=True)
    return records, problems


def find(typed: str, env: Mapping[str, str] | None = None) -> RunRecord:
    """The record ``typed`` names: its id, else the one id it begins. One line otherwise:
    a hostile id, an unknown one, or a prefix of two."""
    problem = id_problem(typed)
    if problem:
        raise ClusterDDPError(f"run id {shown(typed)}: {problem}")
    directory = runs_dir(env)
    exact = _read(directory / f"{typed}{SUFFIX}")
    if exact is not None:
        return exact
    records, _ = load_all(env)
    matches = [r for r in records if r.run_id.startswith(typed)]
    if not matches:
        raise ClusterDDPError(f"no run {shown(typed)} in {clip(str(directory), 200)} (see 'clusterddp ls')")
    if len(matches) > 1:
        names = ", ".join(r.run_id for r in matches[:3]) + (" ..." if len(matches) > 3 else "")
        raise ClusterDDPError(f"run id {shown(typed)} is the start of {len(matches)} runs: {names}",
                              "type more of the id")
    return matches[0]


def now() -> float:
    return time.time()


def all_records(env: Mapping[str, str] | None = None) -> Iterator[RunRecord]:
    yield from load_all(env)[0]

"""What each host runs, built from parts and never by pasting strings together.

Only two strings ever reach a remote shell, both built here with ``shlex.quote``: the stub's
start (``exec PYTHON -c SOURCE``) and the fallback kill (digits only). The launcher's argv
and env travel to the stub as JSON and go into ``execve`` untouched, so no value from the
job file or the command line can be read as shell syntax. ``shell_line`` renders the same
launch as one copy-pasteable shell line for ``--dry-run`` and for starting a node by hand.
"""

from __future__ import annotations

import fnmatch
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

#: Head variables every remote launcher gets (names, or prefixes ending in '*'). Per-host
#: variables (CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, PATH, HOME) are deliberately absent:
#: the remote host's own values are the right ones.
ENV_ALLOW: tuple[str, ...] = (
    "NCCL_*", "GLOO_*", "TORCH_*", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
    "PYTHONWARNINGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
)
#: Set from the detected route to the master unless the user set them.
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

STUB_SOURCE = (Path(__file__).with_name("stub.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class LaunchPlan:
    """One host's launcher: exactly what the stub will ``execve``."""

    host: str
    node_rank: int
    nproc: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    #: ``env_passthrough`` names among ``env``: secrets, shown by ``shell_line`` as ``"$NAME"``.
    passthrough: tuple[str, ...] = ()

    def message(self) -> dict[str, object]:
        """The JSON 'go' message for the stub."""
        return {"argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd}

    def shell_line(self) -> str:
        """The same launch as one shell line (dry run; starting one node by hand). A passthrough
        variable appears as a reference to the caller's own (``NAME="$NAME"``), never its value."""
        exports = " ".join(f'{k}="${k}"' if k in self.passthrough else f"{k}={shlex.quote(v)}"
                           for k, v in sorted(self.env.items()))
        command = " ".join(shlex.quote(a) for a in self.argv)
        return f"cd {shlex.quote(self.cwd)} && " + (f"env {exports} " if exports else "") + command


def stub_command(python: str) -> str:
    """The remote command that starts the stub (the login shell execs into the interpreter)."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(STUB_SOURCE)}"


def kill_command(pid: int, pgid: int, signal_name: str) -> str:
    """Signal the launcher's process group (or only the launcher when it leads no group)."""
    if signal_name not in ("TERM", "KILL"):
        raise ValueError(f"unexpected signal {signal_name!r}")
    target = f"-- -{int(pgid)}" if int(pgid) == int(pid) else str(int(pid))
    return f"kill -{signal_name} {target} 2>/dev/null; true"


def forwarded_env(head_env: Mapping[str, str], extra: Iterable[str] = (),
                  passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The head's variables on the allow-list (plus ``ssh.env_allow``), and the job's
    ``env_passthrough`` names, exactly (they travel in the stub's JSON, never in a shell line)."""
    patterns = (*ENV_ALLOW, *extra)
    names = set(passthrough)
    return {k: v for k, v in head_env.items()
            if k in names or any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def launcher_env(base: Mapping[str, str], job_env: Mapping[str, str], interface: str | None) -> dict[str, str]:
    """Forwarded head env, then the detected interface (unless already set), then the job's env."""
    env = dict(base)
    if interface:
        for name in IFNAME_VARS:
            if name not in job_env and name not in base:
                env[name] = interface
    env.update(job_env)
    return env


def launcher_argv(python: str, target: list[str], *, nnodes: int, node_rank: int, master_addr: str,
                  master_port: int, run_id: str, nproc: int, heartbeat_timeout: float,
                  extra: Iterable[str] = ()) -> tuple[str, ...]:
    """``python -m clusterddp run JOB --nnodes ... --watch-stdin --report-json [extra]``.

    ``target`` is ``[job_path]`` or ``["--", script, args...]`` (torchrun style, no job file);
    the ``--`` part goes last so the launcher's own flags cannot be mistaken for the script's.
    """
    job_part = [] if target and target[0] == "--" else list(target)
    command_part = list(target) if target and target[0] == "--" else []
    return (python, "-m", "clusterddp", "run", *job_part,
            "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--master-addr", master_addr, "--master-port", str(master_port),
            "--run-id", run_id, "--nproc-per-node", str(nproc),
            "--watch-stdin", "--heartbeat-timeout", f"{heartbeat_timeout:g}", "--report-json",
            *extra, *command_part)

"""The first program each host runs: report facts, wait for the head's word, become the launcher.

The head sends this file's source as ``<python> -c SOURCE`` (so it works before anything is
known about the host, even when clusterddp is not importable there) and then talks to it
over stdin, one JSON line each way:

1. head -> stub: ``{"cwd", "env", "master_addr", "master_port", "check_port", "paths"}``
2. stub -> head: ``CLUSTERDDP_PROBE {...facts...}`` (pid, pgid, versions, CPUs, GPUs, route
   and interface to the master, whether the master port is free, missing paths)
3. head -> stub: ``{"argv": [...], "env": {...}, "cwd": ...}`` once every host passed
   preflight; the stub becomes the launcher (in-process when the argv is this interpreter's
   ``-m clusterddp``, else by ``execve``), keeping this PID and the SSH session's stdin (the
   keepalive). EOF instead means "preflight failed elsewhere": exit quietly.

Why one program for both: each remote command costs a login shell (~130 ms of .bashrc on
these hosts) and an interpreter start; probing and launching in the same process halves
that, and it means no shell ever sees an argument or an env value: they travel as JSON and
go straight into ``execve``.

Reads stdin byte by byte on purpose: a buffered read could swallow bytes meant for the
launcher. Standard library only; runs on the remote host's interpreter.
"""

import json
import os
import runpy
import shutil
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional  # typing's aliases: the remote interpreter may be 3.8

#: The stub's one line to the head. Spelled here, not in clusterddp.protocol: this program
#: runs where clusterddp may not be importable; the head (preflight) reads it from here.
PROBE_MARKER = "CLUSTERDDP_PROBE "


def read_message() -> Any:
    data = b""
    while not data.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            sys.exit(0)
        data += byte
    return json.loads(data.decode("utf-8"))


def dist_version(name: str) -> Optional[str]:
    """An installed distribution's version without importing it.

    Looks for ``NAME-VERSION.dist-info`` on sys.path first (a few listdirs), because
    ``importlib.metadata`` costs ~20 ms of CPU per host, which adds up when many hosts share
    a machine's cores; falls back to it for other layouts.
    """
    prefix = name + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in names:
            if item.startswith(prefix) and item.endswith(".dist-info"):
                return item[len(prefix):-len(".dist-info")]
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def clusterddp_facts() -> Dict[str, Any]:
    try:
        import clusterddp
    except Exception as exc:
        return {"version": None, "error": "%s: %s" % (type(exc).__name__, exc)}
    return {"version": getattr(clusterddp, "__version__", None), "file": clusterddp.__file__}


def gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip() in ("", "none", "NoDevFiles"):
            return 0
        return len([e for e in visible.split(",") if e.strip() and e.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def route_to(addr: str) -> Dict[str, Any]:
    """The interface this host uses to reach ``addr`` (for GLOO/NCCL_SOCKET_IFNAME)."""
    if shutil.which("ip") is None:
        return {"error": "the 'ip' command is not installed"}
    out = subprocess.run(["ip", "-o", "route", "get", addr], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip() or "ip route get failed"}
    words = out.stdout.split()
    info: Dict[str, Any] = {"local": bool(words) and words[0] == "local"}
    for key in ("dev", "src"):
        if key in words and words.index(key) + 1 < len(words):
            info[key] = words[words.index(key) + 1]
    if info["local"]:  # the master is this host: the route says 'lo', we want the address's device
        own = subprocess.run(["ip", "-o", "addr", "show", "to", addr], capture_output=True, text=True)
        if own.returncode == 0 and own.stdout.split()[1:2]:
            info["dev"] = own.stdout.split()[1].rstrip(":")
    return info


def port_busy(port: int) -> Optional[str]:
    """Why the master port cannot be bound here; None when it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def probe(request: Dict[str, Any]) -> Dict[str, Any]:
    os.environ.update(request["env"])
    for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
        if entry:
            sys.path.insert(0, entry)
    facts = {"pid": os.getpid(), "pgid": os.getpgid(0), "hostname": socket.gethostname(),
             "python": sys.version.split()[0], "executable": sys.executable,
             "cpus": len(os.sched_getaffinity(0)), "gpus": gpu_count(),
             "missing": [p for p in request["paths"] if not os.path.exists(p)]}
    try:
        os.chdir(request["cwd"])
    except OSError as exc:
        facts["cwd_error"] = exc.strerror
    facts["clusterddp"] = clusterddp_facts()
    facts["torch"] = dist_version("torch")
    if request.get("master_addr"):
        facts["route"] = route_to(request["master_addr"])
    if request.get("check_port"):
        facts["port_busy"] = port_busy(request["master_port"])
    return facts


def run_launcher_here(args: List[str], env: Dict[str, str]) -> None:
    """Become the launcher in this process: it is the interpreter execve would start, and
    skipping a second interpreter start-up saves CPU on every host of a large fan-out."""
    os.environ.update(env)
    sys.argv = ["clusterddp", *args]
    # Exactly ``python -m clusterddp ARGS`` (clusterddp/__main__.py exits with the command's
    # code), without a second interpreter.
    runpy.run_module("clusterddp", run_name="__main__")


def main() -> None:
    facts = probe(read_message())
    sys.stdout.write(PROBE_MARKER + json.dumps(facts) + "\n")
    sys.stdout.flush()
    go = read_message()
    argv = go["argv"]
    try:
        os.chdir(go["cwd"])
        if argv[1:3] == ["-m", "clusterddp"] and os.path.realpath(argv[0]) == os.path.realpath(sys.executable):
            run_launcher_here(argv[3:], go["env"])
        env = dict(os.environ)
        env.update(go["env"])
        os.execve(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write("clusterddp: cannot start %s: %s\n" % (go["argv"][0], exc))
        sys.exit(127)


if __name__ == "__main__":  # "python -c SOURCE" runs as __main__
    main()

"""OpenPAI (protocol v2, k8s runtime): a task learns its place from the runtime's PAI_* variables.

Master = task 0 of the task role: ``PAI_HOST_IP_<r>_0`` and the first port of
``PAI_<r>_0_<label>_PORT`` (task 0's port: ports are hashed per pod, so the current task's
port is a different number). ``<r>`` is the role name as OpenPAI converts it for the
runtime-generated variables (lower case, only ``a-z0-9``), while ``PAI_TASK_ROLE_TASK_COUNT_``
and ``PAI_RESOURCE_`` keep the original spelling: a role ``ps_server`` has
``PAI_HOST_IP_psserver_0`` but ``PAI_TASK_ROLE_TASK_COUNT_ps_server``.

The IP and port variables exist only where the runtime sourced its ``runtime_env.sh``, i.e. in
the job's ``commands`` shell; without gang allocation the other tasks' IPs may be missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.sections.openpai import RESERVED_PORT_LABELS, OpenPAISpec

if TYPE_CHECKING:
    from clusterddp.spec import JobSpec

#: The task's index in its role; the second is the older alias (the seed recipe uses it).
TASK_INDEX = ("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", "PAI_TASK_INDEX")
ROLE_NAME = "PAI_CURRENT_TASK_ROLE_NAME"
#: Original role spelling.
TASK_COUNT = "PAI_TASK_ROLE_TASK_COUNT_{role}"
RESOURCE = "PAI_RESOURCE_{role}"
#: Converted role spelling (``<r>``); both port variables hold the same comma-separated list.
HOST_IP = "PAI_HOST_IP_{r}_{index}"
PORT_VARS = ("PAI_{r}_{index}_{label}_PORT", "PAI_PORT_LIST_{r}_{index}_{label}")
#: ``<user>~<job>``; both hold it (PAI_JOB_NAME is not just the YAML's ``name:``).
RUN_ID = ("PAI_FRAMEWORK_NAME", "PAI_JOB_NAME")
#: FrameworkController's attempt counter: a job retry gets fresh log directories.
ATTEMPT = "FC_FRAMEWORK_ATTEMPT_ID"
#: Names the rendezvous port label when a task role has several and none is the job's.
PORT_LABEL_OVERRIDE = "CLUSTERDDP_OPENPAI_PORT_LABEL"

_DEFAULTS = OpenPAISpec()


def convert_name(name: str) -> str:
    """OpenPAI's ``convertName``: ``name.toLowerCase().replace(/[^a-z0-9]/g, '')``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class _Port:
    label: str
    variable: str
    value: int


class OpenPAIEnv(ClusterEnv):
    """One launcher per OpenPAI task instance; all instances of the role form the job."""

    name = "openpai"
    looks_for = ("PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX or PAI_TASK_INDEX, "
                 "with PAI_HOST_IP_<role>_0 and PAI_<role>_0_<label>_PORT")

    def detected(self) -> bool:
        return self.first_var(*TASK_INDEX) is not None

    def placement(self) -> Placement:
        spec = self._job_section()
        role = self.first_var(ROLE_NAME) or spec.task_role
        node_rank = self.first_int_var(*TASK_INDEX)
        assert node_rank is not None  # detected() guarantees it
        nnodes = self._nnodes(role)
        if not 0 <= node_rank < nnodes:
            raise EnvironmentDetectionError(
                f"openpai: task index {node_rank} is outside 0..{nnodes - 1} "
                f"({nnodes} instances of task role {role!r})")
        hosts = self._hosts(role, nnodes)
        master = hosts[0] if hosts else self._master_addr(role, nnodes)
        port = self._port(role, spec.port_label)
        notes = [f"master is task 0 of task role {role!r}"]
        if port is not None:
            notes.append(f"master port from {port.variable} (label {port.label!r})")
        else:
            notes.append(f"task role {role!r} has no port label for the rendezvous: the master port "
                         "is derived from the run id; add resourcePerInstance.ports to be safe")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=master,
                         master_port=port.value if port else None, nproc_per_node=self._nproc(role),
                         hosts=hosts, run_id=self._run_id(), notes=tuple(notes))

    def _job(self) -> JobSpec | None:
        # ``clusterddp run JOB`` passes the job along with the CLI overrides; there is none for
        # ``run -- train.py``, and then the defaults are those of the spec ``render`` writes.
        return self.overrides.job

    def _job_section(self) -> OpenPAISpec:
        job = self._job()
        return job.openpai if job is not None else _DEFAULTS

    def _nnodes(self, role: str) -> int:
        """Instances of the role: the runtime's count, else the job file's ``nodes``."""
        variable = TASK_COUNT.format(role=role)
        if self.first_var(variable) is not None:
            count = self.int_var(variable)
        else:
            job = self._job()
            if job is None:
                raise EnvironmentDetectionError(
                    f"openpai: {variable} is not set and there is no job file to take 'nodes' from",
                    "run 'clusterddp run JOB' with a job file, or export the variable")
            count = job.nodes
        if count < 1:
            raise EnvironmentDetectionError(f"openpai: {variable}={count} must be >= 1")
        return count

    def _hosts(self, role: str, nnodes: int) -> tuple[str, ...]:
        """Every task's IP in index order, or () when some are unknown (no gang allocation)."""
        hosts = [self._host_ip(role, index) for index in range(nnodes)]
        return tuple(h for h in hosts if h) if all(hosts) else ()

    def _host_ip(self, role: str, index: int) -> str | None:
        names = [HOST_IP.format(r=r, index=index) for r in _spellings(role)]
        return self.first_var(*names)

    def _master_addr(self, role: str, nnodes: int) -> str:
        addr = self._host_ip(role, 0)
        if addr is not None:
            return addr
        if nnodes == 1:
            return "127.0.0.1"  # hostNetwork pod: task 0 is this very node
        raise EnvironmentDetectionError(
            f"openpai: {HOST_IP.format(r=convert_name(role), index=0)} is not set, so this task cannot "
            "find task 0: the job runs without gang allocation and the other tasks' IPs are unknown",
            "set extras.gangAllocation: true in the OpenPAI job; 'clusterddp render openpai' does")

    def _port(self, role: str, job_label: str) -> _Port | None:
        """Task 0's first port of the rendezvous label.

        Label: CLUSTERDDP_OPENPAI_PORT_LABEL if set (must exist), else the job's label if the
        role has it, else the only label besides OpenPAI's own 'ssh' and 'http'.
        """
        forced = self.first_var(PORT_LABEL_OVERRIDE)
        if forced is not None:
            port = self._port_of(role, forced)
            if port is None:
                names = " or ".join(PORT_VARS[0].format(r=r, index=0, label=forced) for r in _spellings(role))
                raise EnvironmentDetectionError(
                    f"openpai: {PORT_LABEL_OVERRIDE}={forced} but {names} is not set",
                    f"task role {role!r} has port labels: {', '.join(self._labels(role)) or 'none'}")
            return port
        port = self._port_of(role, job_label)
        if port is not None:
            return port
        labels = [label for label in self._labels(role) if label not in RESERVED_PORT_LABELS]
        if len(labels) > 1:
            raise EnvironmentDetectionError(
                f"openpai: task role {role!r} has several port labels ({', '.join(labels)}) and none "
                f"is {job_label!r}", f"set openpai.port_label in the job file or {PORT_LABEL_OVERRIDE}")
        return self._port_of(role, labels[0]) if labels else None

    def _port_of(self, role: str, label: str) -> _Port | None:
        for r in _spellings(role):
            for pattern in PORT_VARS:
                variable = pattern.format(r=r, index=0, label=label)
                raw = self.first_var(variable)
                if raw is not None:
                    return _Port(label, variable, _first_port(variable, raw))
        return None

    def _labels(self, role: str) -> list[str]:
        """Port labels of the role's task 0, as the runtime exported them (sorted)."""
        found = set()
        for r in _spellings(role):
            prefix, suffix = f"PAI_{r}_0_", "_PORT"
            listed = f"PAI_PORT_LIST_{r}_0_"
            for name in self.env:
                if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix):
                    found.add(name[len(prefix):-len(suffix)])
                elif name.startswith(listed) and len(name) > len(listed):
                    found.add(name[len(listed):])
        return sorted(found)

    def _nproc(self, role: str) -> int | None:
        """Workers per node the scheduler sized the task for: its GPUs, or its CPU slots.

        With ``gpu: 0`` the CPU field is the right hint, not the machine's cores: the
        container's CPU limit is a cgroup quota, and the affinity mask still shows every
        core of the host. A job's own ``nproc_per_node`` number still wins.
        """
        variable = RESOURCE.format(role=role)
        raw = self.first_var(variable)
        if raw is None:
            return None
        fields = [f.strip() for f in raw.split(",")]
        try:
            gpu, cpu = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            raise EnvironmentDetectionError(
                f"openpai: {variable}={raw!r} is not '<gpu>,<cpu>,<memoryMB>,<shmMB>'") from None
        if gpu > 0:
            return gpu
        return cpu if cpu > 0 else None

    def _run_id(self) -> str | None:
        if self.overrides.run_id:
            return self.overrides.run_id
        framework = self.first_var(*RUN_ID)
        if framework is None:
            return None
        attempt = self.first_var(ATTEMPT)
        return f"{framework}-attempt{attempt}" if attempt is not None else framework


def _spellings(role: str) -> tuple[str, ...]:
    """The converted name OpenPAI uses, then the original for hand-made environments."""
    converted = convert_name(role)
    return (converted,) if converted == role else (converted, role)


def _first_port(variable: str, raw: str) -> int:
    first = raw.split(",")[0].strip()
    if first.isdigit() and 1 <= int(first) <= 65535:
        return int(first)
    raise EnvironmentDetectionError(f"openpai: {variable}={raw!r} does not start with a port number")

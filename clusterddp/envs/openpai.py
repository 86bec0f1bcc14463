"""OpenPAI (protocol v2, k8s runtime): a task learns its place from the runtime's PAI_* variables.

Master = task 0 of the task role: ``PAI_HOST_IP_<r>_0`` and the first port of
``PAI_<r>_0_<label>_PORT`` (task 0's port: ports are hashed per pod, so the current task's
port is a different number). ``<r>`` is the role name as OpenPAI converts it for the
runtime-generated variables (lower case, only ``a-z0-9``), while ``PAI_TASK_ROLE_TASK_COUNT_``
and ``PAI_RESOURCE_`` keep the original spelling: a role ``ps_server`` has
``PAI_HOST_IP_psserver_0`` but ``PAI_TASK_ROLE_TASK_COUNT_ps_server``.

The IP and port variables exist only where the runtime sourced its ``runtime_env.sh``, i.e. in
the job's ``commands`` shell; without gang allocation the other tasks' IPs may be missing.

OpenPAI retries a job as a whole (``jobRetryCount``: FrameworkController deletes every pod of
the attempt and creates them all again, on nodes and ports chosen anew), and counts the
attempts in ``FC_FRAMEWORK_ATTEMPT_ID`` (0, 1, ...). So under OpenPAI a start is attempt
``FC_FRAMEWORK_ATTEMPT_ID`` (TORCHELASTIC_RESTART_COUNT) and the node never restarts its
workers alone: ``restarts`` is OpenPAI's retry count (docs/openpai.md, "Fault tolerance").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterddp.envs.base import ClusterEnv, Placement, run_id_from
from clusterddp.errors import EnvironmentDetectionError
from clusterddp.sections.openpai import RESERVED_PORT_LABELS, OpenPAISpec
from clusterddp.validate import (ENV_NAME, MAX_COUNT, MAX_NODES, MAX_WORKERS_ENV, max_workers_per_node,
                                 env_name_problem, int_text_problem, line_problem, shown)

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
#: FrameworkController's attempt counter (its ``RetryPolicyStatus.TotalRetriedCount``: 0 on
#: the first start, +1 on every retry of the whole job): TORCHELASTIC_RESTART_COUNT, and a
#: job retry gets fresh log directories.
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
        role = self._name_var(ROLE_NAME) or spec.task_role
        node_rank = self.first_int_var(*TASK_INDEX, high=MAX_NODES - 1)
        assert node_rank is not None  # detected() guarantees it
        nnodes, counted = self._nnodes(role)
        if node_rank >= nnodes:
            raise EnvironmentDetectionError(
                f"openpai: task index {node_rank} is outside 0..{nnodes - 1} "
                f"({nnodes} instances of task role {role!r})")
        hosts = self._hosts(role, nnodes)
        master = hosts[0] if hosts else self._master_addr(role, nnodes)
        port = self._port(role, spec.port_label)
        attempt = self.first_int_var(ATTEMPT, high=MAX_COUNT) or 0
        notes = [f"master is task 0 of task role {role!r}", *counted,
                 f"job attempt {attempt} ({ATTEMPT}): OpenPAI retries the whole job (jobRetryCount), "
                 "so this node never restarts its workers alone"]
        if port is not None:
            notes.append(f"master port from {port.variable} (label {port.label!r})")
        else:
            notes.append(f"task role {role!r} has no port label for the rendezvous: the master port "
                         "is derived from the run id; add resourcePerInstance.ports to be safe")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=master,
                         master_port=port.value if port else None, nproc_per_node=self._nproc(role),
                         hosts=hosts, run_id=self._run_id(), notes=tuple(notes), restart_count=attempt)

    def _job(self) -> JobSpec | None:
        # ``clusterddp run JOB`` passes the job along with the CLI overrides; there is none for
        # ``run -- train.py``, and then the defaults are those of the spec ``render`` writes.
        return self.overrides.job

    def _job_section(self) -> OpenPAISpec:
        job = self._job()
        return job.openpai if job is not None else _DEFAULTS

    def _nnodes(self, role: str) -> tuple[int, tuple[str, ...]]:
        """Instances of the role: the runtime's count, else the job file's ``nodes`` (a fixed
        count: a role runs a fixed number of instances), else the number of task IPs the
        runtime exported (with a note saying so)."""
        variable = TASK_COUNT.format(role=role)
        if self.raw_var(variable) is not None:
            return self.int_var(variable, low=1, high=MAX_NODES), ()
        job = self._job()
        low, high = job.node_range if job is not None else (0, -1)
        if low == high:
            return low, ()
        why = "there is no job file" if job is None else f"the job's nodes {job.nodes!r} is a range"
        count = self._count_host_ips(role)
        if count == 0:
            raise EnvironmentDetectionError(
                f"openpai: {variable} is not set, {why}, and no "
                f"{HOST_IP.format(r=convert_name(role), index=0)} to count the tasks by",
                "run 'clusterddp run JOB' with a job file whose nodes is a count, or export the variable")
        first, last = (HOST_IP.format(r=convert_name(role), index=i) for i in (0, count - 1))
        return count, (f"{count} node(s) counted from the task IPs {first}..{last}: {variable} is not "
                       f"set and {why}; without gang allocation some IPs may be missing",)

    def _count_host_ips(self, role: str) -> int:
        """How many task IPs ``PAI_HOST_IP_<r>_0..N-1`` are set, contiguous from 0; a gap (an IP
        set past a missing one) is an error, as the count would be wrong."""
        count = 0
        while count < MAX_NODES and self._host_ip(role, count) is not None:
            count += 1
        prefixes = tuple(f"PAI_HOST_IP_{r}_" for r in _spellings(role))
        for name in self.env:
            index = name[len(next((p for p in prefixes if name.startswith(p)), name)):]
            if name.startswith(prefixes) and index.isascii() and index.isdigit() and int(index) > count:
                raise self.error(name, f"is set but task {count}'s IP is not: the task IPs are not "
                                       f"contiguous, so the number of tasks is unknown",
                                 f"export {TASK_COUNT.format(role=role)} or run with a job file")
        return count

    def _hosts(self, role: str, nnodes: int) -> tuple[str, ...]:
        """Every task's IP in index order, or () when some are unknown (no gang allocation)."""
        hosts = [self._host_ip(role, index) for index in range(nnodes)]
        return tuple(h for h in hosts if h) if all(hosts) else ()

    def _host_ip(self, role: str, index: int) -> str | None:
        names = [HOST_IP.format(r=r, index=index) for r in _spellings(role)]
        return self.host_var(*names)

    def _name_var(self, name: str) -> str | None:
        """A role name or port label from a variable: OpenPAI's grammar ``[A-Za-z_][A-Za-z0-9_]*``."""
        raw = self.raw_var(name)
        if raw is not None and env_name_problem(raw) is not None:
            raise self.error(name, f"expected a name of letters, digits and '_', got {shown(raw)}")
        return raw

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
        forced = self._name_var(PORT_LABEL_OVERRIDE)
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
                raw = self.raw_var(variable)
                if raw is not None:
                    return _Port(label, variable, self._first_port(variable, raw))
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
        return sorted(label for label in found if ENV_NAME.fullmatch(label))

    def _nproc(self, role: str) -> int | None:
        """Workers per node the scheduler sized the task for: its GPUs, or its CPU slots.

        With ``gpu: 0`` the CPU field is the right hint, not the machine's cores: the
        container's CPU limit is a cgroup quota, and the affinity mask still shows every
        core of the host. A job's own ``nproc_per_node`` number still wins.
        """
        variable = RESOURCE.format(role=role)
        raw = self.raw_var(variable)
        if raw is None:
            return None
        fields = raw.split(",")
        if len(fields) < 2 or any(int_text_problem(f, 0, MAX_COUNT) for f in fields[:2]):
            raise self.error(variable, f"expected '<gpu>,<cpu>,<memoryMB>,<shmMB>', got {shown(raw)}")
        gpu, cpu = int(fields[0]), int(fields[1])
        bound = max_workers_per_node(dict(self.env))
        if gpu > bound:  # CPU slots are a hint the job's own number overrides; GPUs are workers
            raise self.error(variable, f"{gpu} GPUs, one worker each, is over the bound of {bound} "
                                       "workers on one node", f"set {MAX_WORKERS_ENV} to go past it")
        return gpu or cpu or None

    def _run_id(self) -> str | None:
        if self.overrides.run_id:
            return self.overrides.run_id
        framework = self.id_var(*RUN_ID)
        if framework is None:
            return None
        attempt = self.first_int_var(ATTEMPT, high=MAX_COUNT)
        return run_id_from(f"{framework}-attempt{attempt}" if attempt is not None else framework)

    def _first_port(self, variable: str, raw: str) -> int:
        """The first port of a comma-separated list, strictly 1-65535."""
        first = raw.split(",")[0]
        if line_problem(raw) or int_text_problem(first, 1, 65535):
            raise self.error(variable, f"does not start with a port number (1-65535): {shown(raw)}")
        return int(first)


def _spellings(role: str) -> tuple[str, ...]:
    """The converted name OpenPAI uses, then the original for hand-made environments."""
    converted = convert_name(role)
    return (converted,) if converted == role else (converted, role)


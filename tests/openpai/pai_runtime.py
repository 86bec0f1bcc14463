"""Every variable an OpenPAI (protocol v2, k8s runtime) task sees, built the way OpenPAI builds it.

Sources, as summarised in shared/reference/openpai.md: the REST server's static job and
task-role variables (runtime-env.js, k8s.js), FrameworkController's FC_* variables, and the
runtime's generated runtime_env.sh (framework_parser.py genenv). Spellings are the real
ones, including the trap that runtime-generated names use the *converted* role name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

#: The REST server's default schedule-port range (schedule-port.js).
PORT_START, PORT_END = 15000, 40000


def convert_name(name: str) -> str:
    """OpenPAI's convertName, written again here so the tests do not trust the code they test."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class TaskRole:
    """One task role of a job as OpenPAI sees it (resourcePerInstance and instances)."""

    name: str
    instances: int
    ips: tuple[str, ...]
    ports: dict[str, int] = field(default_factory=lambda: {"SynPort": 1})
    gpu: int = 0
    cpu: int = 2
    memory_mb: int = 4096
    shm_mb: int = 0

    def all_ports(self) -> dict[str, int]:
        """The user's labels plus 'ssh' and 'http', which the REST server always adds."""
        return {**self.ports, "ssh": 1, "http": 1}


def pod_uid(user: str, job: str, role: str, index: int, attempt: int) -> str:
    digest = hashlib.md5(f"{user}~{job}/{role}/{index}/{attempt}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def port_list(uid: str, label: str, count: int) -> list[int]:
    """Ports hashed from [podUID][label][k] into the schedule range: they differ per task."""
    span = PORT_END - PORT_START
    return [PORT_START + int(hashlib.md5(f"{uid}{label}{k}".encode()).hexdigest(), 16) % span
            for k in range(count)]


def runtime_env(user: str, job: str, roles: list[TaskRole], role: str, index: int, *,
                gang: bool = True, attempt: int = 0, virtual_cluster: str = "default") -> dict[str, str]:
    """The environment of task ``index`` of ``role`` when the user's commands start."""
    current = next(r for r in roles if r.name == role)
    framework = f"{user}~{job}"
    total = sum(r.instances for r in roles)
    env: dict[str, str] = {
        # runtime-env.js: job-level, original role spellings.
        "PAI_FRAMEWORK_NAME": framework,
        "PAI_JOB_NAME": framework,
        "PAI_USER_NAME": user,
        "PAI_DEFAULT_FS_URI": "",
        "PAI_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_TASK_ROLE_LIST": ",".join(r.name for r in roles),
        "PAI_VIRTUAL_CLUSTER": virtual_cluster,
        "PAI_USERNAME": user,
        "PAI_TASKS_NUM": str(total),
        "PAI_JOB_TASK_COUNT": str(total),
        "PAI_TASK_ROLES_NUM": str(len(roles)),
        "PAI_JOB_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_JOB_TASK_ROLE_LIST": ",".join(r.name for r in roles),
        # k8s.js: task-role level.
        "PAI_CURRENT_TASK_ROLE_NAME": role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(index),
        "PAI_TASK_INDEX": str(index),
        # FrameworkController (constants.go).
        "FC_FRAMEWORK_NAMESPACE": "default",
        "FC_FRAMEWORK_NAME": hashlib.md5(framework.encode()).hexdigest(),
        "FC_TASKROLE_NAME": convert_name(role),
        "FC_TASK_INDEX": str(index),
        "FC_CONFIGMAP_NAME": hashlib.md5(framework.encode()).hexdigest() + "-attempt",
        "FC_POD_NAME": f"{hashlib.md5(framework.encode()).hexdigest()}-{convert_name(role)}-{index}",
        "FC_FRAMEWORK_ATTEMPT_ID": str(attempt),
        "FC_FRAMEWORK_ATTEMPT_INSTANCE_UID": f"{attempt}_{pod_uid(user, job, 'fw', 0, attempt)}",
        "FC_CONFIGMAP_UID": pod_uid(user, job, "cm", 0, attempt),
        "FC_TASK_ATTEMPT_ID": "0",
        "FC_TASK_ATTEMPT_INSTANCE_UID": f"0_{pod_uid(user, job, role, index, attempt)}",
        "FC_POD_UID": pod_uid(user, job, role, index, attempt),
        "PAI_WORK_DIR": "/usr/local/pai",
    }
    if current.gpu == 0:
        env["NVIDIA_VISIBLE_DEVICES"] = "none"
    instances = []
    for r in roles:
        env[f"PAI_TASK_ROLE_TASK_COUNT_{r.name}"] = str(r.instances)
        env[f"PAI_RESOURCE_{r.name}"] = f"{r.gpu},{r.cpu},{r.memory_mb},{r.shm_mb}"
        env[f"PAI_MIN_FAILED_TASK_COUNT_{r.name}"] = "1"
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{r.name}"] = str(r.instances)
        # framework_parser.py genenv: converted role spelling, labels verbatim, every task.
        conv = convert_name(r.name)
        host_list = []
        for i in range(r.instances):
            uid = pod_uid(user, job, r.name, i, attempt)
            known = gang or (r.name == role and i == index)
            http = port_list(uid, "http", 1)[0]
            for label, count in r.all_ports().items():
                ports = ",".join(str(p) for p in port_list(uid, label, count))
                env[f"PAI_PORT_LIST_{conv}_{i}_{label}"] = ports
                env[f"PAI_{conv}_{i}_{label}_PORT"] = ports
            if known:
                env[f"PAI_HOST_IP_{conv}_{i}"] = r.ips[i]
                host_list.append(f"{r.ips[i]}:{http}")
            instances.append(f"{conv}:{i}")
        env[f"PAI_TASK_ROLE_{conv}_HOST_LIST"] = ",".join(host_list)
    env["PAI_TASK_ROLE_INSTANCES"] = ",".join(instances)
    # The current task only (backward compatibility).
    uid = pod_uid(user, job, role, index, attempt)
    mine = {label: port_list(uid, label, count) for label, count in current.all_ports().items()}
    ip = current.ips[index]
    env.update({
        "PAI_CURRENT_CONTAINER_IP": ip,
        "PAI_CURRENT_CONTAINER_PORT": str(mine["http"][0]),
        "PAI_CONTAINER_HOST_IP": ip,
        "PAI_CONTAINER_HOST_PORT": str(mine["http"][0]),
        "PAI_CONTAINER_SSH_PORT": str(mine["ssh"][0]),
        "PAI_CONTAINER_HOST_PORT_LIST": "".join(
            f"{label}:{','.join(map(str, ports))};" for label, ports in mine.items()),
    })
    for label, ports in mine.items():
        env[f"PAI_CONTAINER_HOST_{label}_PORT_LIST"] = ",".join(map(str, ports))
    return env


#: The only variables the seed's recipe (upstream's DDP example) reads.
SEED_VARIABLES = ("PAI_HOST_IP_worker_0", "PAI_worker_0_SynPort_PORT", "PAI_TASK_INDEX")

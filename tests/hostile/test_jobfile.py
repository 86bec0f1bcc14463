"""Hostile job files: every one is one JobSpecError line naming file:line and key; nothing else
escapes load_job, nothing is created, nothing starts (issue 10, item 1 and the input half of 8)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import validate
from clusterddp.errors import JobSpecError
from clusterddp.spec import JobSpec, load_job
from tests.conftest import REPO, cli

SCRIPT = f"script: {REPO / 'jobs' / 'hello.py'}\n"
#: A line of an error: the prefix, the key path, the problem, a hint; never more.
MAX_MESSAGE_CHARS = 1200

#: Fields whose value becomes a name, path or single line: no control character of any kind.
LINE_FIELDS = [
    "name", "python", "workdir", "logs.dir", "master.addr",
    "ssh.hosts[0]", "ssh.hostfile", "ssh.user", "ssh.identity_file", "ssh.config_file",
    "ssh.known_hosts", "ssh.include[0]", "ssh.exclude[0]", "ssh.env_allow[0]", "ssh.interface",
    "slurm.partition", "slurm.account", "slurm.qos", "slurm.constraint", "slurm.output",
    "slurm.error", "slurm.mem", "slurm.time", "slurm.signal", "slurm.extra_sbatch[0]",
    "slurm.setup[0]", "container.image", "container.mounts[0]", "container.workdir", "container.env[0]",
    "container.launcher", "openpai.name", "openpai.virtual_cluster",
    "openpai.task_role", "openpai.port_label", "openpai.setup[0]", "env_passthrough[0]",
    "forward_signals[0]",
]
#: Free text (an argument, an env value): any character but NUL, bounded size.
TEXT_FIELDS = ["args[0]", "env.A", "openpai.parameters.P"]
CONTROLS = {"newline": "x\ny", "cr": "x\ry", "esc": "x\x1b[2Jy", "nul": "x\x00y", "u2028": "x\u2028y",
            "nel": "x\x85y", "bidi": "x\u202ey"}


def _flow(path: str, value: object) -> str:
    """``ssh.hosts[0]`` = value as one YAML flow line (so the error line is always 2)."""
    text = json.dumps(value)
    parts = path.split(".")
    for part in reversed(parts):
        match = re.fullmatch(r"(\w+)\[0\]", part)
        if match:
            text = f"{match.group(1)}: [{text}]"
        else:
            text = f"{part}: {text}"
        text = "{" + text + "}"
    return text[1:-1] + "\n"


def _generated() -> list[tuple[str, str, str, str]]:
    cases = []
    for field in LINE_FIELDS:
        for label, value in CONTROLS.items():
            cases.append((f"{field}-{label}", _flow(field, value), field, ""))
    for field in TEXT_FIELDS:
        cases.append((f"{field}-nul", _flow(field, "a\x00b"), field, "NUL byte"))
        cases.append((f"{field}-huge", _flow(field, "x" * (validate.MAX_VALUE_CHARS + 1)), field,
                      "characters long"))
    return cases


# (id, yaml after the script line (line 1), key named, fragment); the error is on line 2.
EXPLICIT = [
    ("tag-foo", "args: !foo x\n", "args", "tag '!foo' is not allowed"),
    ("tag-python-name", "args: !!python/name:os.system x\n", "args", "python/name:os.system"),
    ("tag-python-apply", "name: !!python/object/apply:os.system [ls]\n", "name", "is not allowed"),
    ("tag-binary", "name: !!binary aGVsbG8=\n", "name", "binary"),
    ("tag-set", "args: !!set {a: null}\n", "args", "set"),
    ("tag-in-list", "args: [!foo x]\n", "args[0]", "is not allowed"),
    ("tag-on-mapping", "ssh: !custom {port: 22}\n", "ssh", "is not allowed"),
    ("tag-on-env-value", "env: {A: !x y}\n", "env.A", "is not allowed"),
    ("tag-on-key", "!foo nodes: 2\n", "", "is not allowed"),
    ("merge-key", "master: {<<: {port: 1}}\n", "master", "merge key"),
    ("nproc-1e26", "nproc_per_node: 100000000000000000000000000\n", "nproc_per_node", "integer out of range"),
    ("nproc-100k", "nproc_per_node: 100000\n", "nproc_per_node", "CLUSTERDDP_MAX_WORKERS_PER_NODE"),
    ("nproc-257", "nproc_per_node: 257\n", "nproc_per_node", "over the bound of 256"),
    ("nproc-zero", "nproc_per_node: 0\n", "nproc_per_node", "must be >= 1"),
    ("nproc-negative", "nproc_per_node: -4\n", "nproc_per_node", "must be >= 1"),
    ("nproc-float", "nproc_per_node: 1.5\n", "nproc_per_node", "expected an integer"),
    ("nproc-inf", "nproc_per_node: .inf\n", "nproc_per_node", "expected an integer"),
    ("nproc-bool", "nproc_per_node: true\n", "nproc_per_node", "expected an integer"),
    ("nodes-1e26", "nodes: 100000000000000000000000000\n", "nodes", "out of range"),
    ("nodes-range-reversed", "nodes: '4:3'\n", "nodes", "MIN 4 is more than MAX 3"),
    ("nodes-range-zero", "nodes: '0:3'\n", "nodes", "must be > 0, got 0"),
    ("nodes-range-huge", "nodes: '1:70000'\n", "nodes", "over the bound of 65536"),
    ("nodes-range-digits", "nodes: '1:" + "9" * 50 + "'\n", "nodes", "expected an integer or 'MIN:MAX'"),
    ("nodes-range-three", "nodes: '1:2:3'\n", "nodes", "expected an integer or 'MIN:MAX'"),
    ("nodes-range-blank", "nodes: ' 1:2'\n", "nodes", "expected an integer or 'MIN:MAX'"),
    ("nodes-range-newline", "nodes: \"1:\\n2\"\n", "nodes", ""),
    ("nodes-range-negative", "nodes: '-1:2'\n", "nodes", "expected an integer or 'MIN:MAX'"),
    ("nodes-range-empty", "nodes: ''\n", "nodes", "expected an integer or 'MIN:MAX'"),
    ("restarts-base60", "restarts: 1:30\n", "restarts", "YAML's base-60 number 90"),
    ("nodes-70000", "nodes: 70000\n", "nodes", "over the bound of 65536"),
    ("nodes-negative", "nodes: -1\n", "nodes", "must be > 0"),
    ("nodes-nan", "nodes: .nan\n", "nodes", "expected an integer"),
    ("int-5000-digits", "nodes: " + "9" * 5000 + "\n", "nodes", "cannot read the value"),
    ("restarts-negative", "restarts: -3\n", "restarts", "must be >= 0"),
    ("restarts-huge", "restarts: " + "9" * 30 + "\n", "restarts", "out of range"),
    ("grace-negative", "grace_period: -1\n", "grace_period", "must be >= 0"),
    ("grace-inf", "grace_period: .inf\n", "grace_period", "finite"),
    ("grace-nan", "grace_period: .nan\n", "grace_period", "finite"),
    ("grace-minus-inf", "grace_period: -.inf\n", "grace_period", "finite"),
    ("hang-zero", "hang_timeout: 0\n", "hang_timeout", "must be > 0"),
    ("hang-1e300", "hang_timeout: 1.0e+300\n", "hang_timeout", "at most 10000000 seconds"),
    ("grace-1e300", "grace_period: 1.0e+300\n", "grace_period", "at most 10000000 seconds"),
    ("ssh-timeout-1e300", "ssh: {connect_timeout: 1.0e+300}\n", "ssh.connect_timeout", "at most"),
    ("hang-inf", "hang_timeout: .inf\n", "hang_timeout", "finite"),
    ("hang-nan", "hang_timeout: .nan\n", "hang_timeout", "finite"),
    ("port-zero", "master: {port: 0}\n", "master.port", "port must be 1-65535, got 0"),
    ("port-99999", "master: {port: 99999}\n", "master.port", "port must be 1-65535, got 99999"),
    ("port-huge", "master: {port: 1000000000000000000000}\n", "master.port", "out of range"),
    ("ssh-port-zero", "ssh: {port: 0}\n", "ssh.port", "port must be 1-65535"),
    ("ssh-timeout-inf", "ssh: {connect_timeout: .inf}\n", "ssh.connect_timeout", "finite"),
    ("ssh-timeout-nan", "ssh: {connect_timeout: .nan}\n", "ssh.connect_timeout", "finite"),
    ("ssh-parallel-huge", "ssh: {parallel: 1000000}\n", "ssh.parallel", "must be 1-4096"),
    ("ssh-link-empty", "ssh: {link_timeout: ''}\n", "ssh.link_timeout", "expected a number, got str"),
    ("ssh-link-string", "ssh: {link_timeout: fast}\n", "ssh.link_timeout", "expected a number, got str"),
    ("ssh-link-unit", "ssh: {link_timeout: 1s}\n", "ssh.link_timeout", "expected a number, got str"),
    ("ssh-link-bool", "ssh: {link_timeout: true}\n", "ssh.link_timeout", "expected a number, got bool"),
    ("ssh-link-null", "ssh: {link_timeout: ~}\n", "ssh.link_timeout", "expected a number, got nothing"),
    ("ssh-link-list", "ssh: {link_timeout: [1]}\n", "ssh.link_timeout", "expected a number"),
    ("ssh-link-negative", "ssh: {link_timeout: -1}\n", "ssh.link_timeout", "must be at least 0.5 s, got -1"),
    ("ssh-link-zero", "ssh: {link_timeout: 0}\n", "ssh.link_timeout", "must be at least 0.5 s, got 0:"),
    ("ssh-link-tiny", "ssh: {link_timeout: 0.1}\n", "ssh.link_timeout", "gets a single resend"),
    ("ssh-link-just-under", "ssh: {link_timeout: 0.499}\n", "ssh.link_timeout", "at least 0.5 s"),
    ("ssh-link-over", "ssh: {link_timeout: 5.001}\n", "ssh.link_timeout", "must be at most 5 s, got 5.001"),
    ("ssh-link-huge", "ssh: {link_timeout: 1.0e+300}\n", "ssh.link_timeout", "at most 5 s, got 1e+300"),
    ("ssh-link-huge-int", "ssh: {link_timeout: " + "9" * 30 + "}\n", "ssh.link_timeout", "at most 5 s"),
    ("ssh-link-inf", "ssh: {link_timeout: .inf}\n", "ssh.link_timeout", "finite"),
    ("ssh-link-minus-inf", "ssh: {link_timeout: -.inf}\n", "ssh.link_timeout", "finite"),
    ("ssh-link-nan", "ssh: {link_timeout: .nan}\n", "ssh.link_timeout", "finite"),
    ("openpai-cpu-zero", "openpai: {cpu: 0}\n", "openpai.cpu", "must be > 0"),
    ("slurm-gpus-negative", "slurm: {gpus_per_node: -1}\n", "slurm.gpus_per_node", "must be >= 0"),
    ("logs-rank-negative", "logs: {ranks: [-1]}\n", "logs.ranks[0]", "not a rank"),
    ("sig-kill", "forward_signals: [SIGKILL]\n", "forward_signals[0]", "SIGKILL cannot be forwarded"),
    ("sig-stop", "forward_signals: [SIGSTOP]\n", "forward_signals[0]", "SIGSTOP cannot be forwarded"),
    ("sig-tstp", "forward_signals: [SIGTSTP]\n", "forward_signals[0]", "cannot be forwarded"),
    ("sig-segv", "forward_signals: [SIGSEGV]\n", "forward_signals[0]", "cannot be forwarded"),
    ("sig-pipe", "forward_signals: [SIGPIPE]\n", "forward_signals[0]", "cannot be forwarded"),
    ("sig-dfl", "forward_signals: [SIG_DFL]\n", "forward_signals[0]", "unknown signal 'SIG_DFL'"),
    ("sig-ign", "forward_signals: [SIG_IGN]\n", "forward_signals[0]", "unknown signal 'SIG_IGN'"),
    ("sig-term", "forward_signals: [SIGTERM]\n", "forward_signals[0]", "SIGTERM stops the job"),
    ("sig-int", "forward_signals: [SIGUSR1, SIGINT]\n", "forward_signals[1]", "SIGINT stops the job"),
    ("sig-hup", "forward_signals: [SIGHUP]\n", "forward_signals[0]", "stops the job"),
    ("sig-quit", "forward_signals: [SIGQUIT]\n", "forward_signals[0]", "stops the job"),
    ("sig-chld", "forward_signals: [SIGCHLD]\n", "forward_signals[0]", "launcher's own"),
    ("sig-rtmin", "forward_signals: [SIGRTMIN]\n", "forward_signals[0]", "unknown signal"),
    ("sig-no-prefix", "forward_signals: [USR1]\n", "forward_signals[0]", "unknown signal"),
    ("sig-lower", "forward_signals: [sigusr1]\n", "forward_signals[0]", "unknown signal"),
    ("sig-number", "forward_signals: [9]\n", "forward_signals[0]", "unknown signal"),
    ("sig-attr", "forward_signals: [SIGNALS]\n", "forward_signals[0]", "unknown signal"),
    ("name-newline", 'name: "hello\\n"\n', "name", "must be a name"),
    ("name-bang", "name: 'my job!'\n", "name", "must be a name"),
    ("name-dash", "name: -x\n", "name", "must be a name"),
    ("name-dotdot", "name: '..'\n", "name", "must be a name"),
    ("name-dot", "name: .hidden\n", "name", "must be a name"),
    ("name-slash", "name: a/b\n", "name", "must be a name"),
    ("name-empty", "name: ''\n", "name", "must be a name"),
    ("name-long", f"name: {'x' * 200}\n", "name", "at most 128"),
    ("name-unicode", "name: jöb\n", "name", "must be a name"),
    ("name-space", "name: 'a b'\n", "name", "must be a name"),
    ("name-null", "name: ~\n", "name", "expected a string, got nothing"),
    ("name-bool", "name: yes\n", "name", "expected a string, got bool"),
    ("name-date", "name: 2020-01-01\n", "name", "expected a string, got date"),
    ("env-key-newline", 'env: {"A\\n": x}\n', "env", "control character"),
    ("env-key-digit", "env: {1BAD: x}\n", "env", "invalid environment variable name"),
    ("env-key-equals", "env: {A=B: x}\n", "env", "invalid environment variable name"),
    ("env-key-space", "env: {'A B': x}\n", "env", "invalid environment variable name"),
    ("env-key-empty", "env: {'': x}\n", "env", "non-empty"),
    ("env-key-huge", f"env: {{{'A' * 300}: x}}\n", "env", "characters long"),
    ("env-key-nul", 'env: {"A\\0": x}\n', "env", "NUL"),
    ("env-dup", "env: {A: x, A: y}\n", "env.A", "duplicate key"),
    ("env-value-list", "env: {A: [1]}\n", "env.A", "expected a string, got a list"),
    ("env-value-null", "env: {A: ~}\n", "env.A", "expected a string, got nothing"),
    ("env-value-map", "env: {A: {b: c}}\n", "env.A", "expected a string, got a mapping"),
    ("passthrough-bad", "env_passthrough: ['A B']\n", "env_passthrough[0]", "invalid environment variable"),
    ("master-addr-option", "master: {addr: -oProxyCommand=x}\n", "master.addr", "host name or IP"),
    ("master-addr-space", "master: {addr: 'a b'}\n", "master.addr", "host name or IP"),
    ("master-addr-semicolon", "master: {addr: 'h;rm -rf /'}\n", "master.addr", "host name or IP"),
    ("master-addr-empty", "master: {addr: ''}\n", "master.addr", "host name or IP"),
    ("module-injection", "module: 'os;ls'\n", "module", "dotted Python module"),
    ("module-dash", "module: -c\n", "module", "dotted Python module"),
    ("module-dots", "module: a..b\n", "module", "dotted Python module"),
    ("logs-dir-empty", "logs: {dir: ''}\n", "logs.dir", "must not be empty"),
    ("workdir-empty", "workdir: ''\n", "workdir", "must not be empty"),
    ("python-empty", "python: ''\n", "python", "must not be empty"),
    ("slurm-mem-trailing-newline", 'slurm: {mem: "4G\\n"}\n', "slurm.mem", "invalid value"),
    ("slurm-time-trailing-newline", 'slurm: {time: "1:00\\n"}\n', "slurm.time", "invalid value"),
    ("slurm-signal-trailing-newline", 'slurm: {signal: "B:USR1@90\\n"}\n', "slurm.signal", "invalid value"),
    ("slurm-signal-unknown", "slurm: {signal: 'B:FOO@9'}\n", "slurm.signal", "unknown signal"),
    ("slurm-partition-dash", "slurm: {partition: --wrap=x}\n", "slurm.partition", "leading '-'"),
    ("slurm-partition-space", "slurm: {partition: 'a b'}\n", "slurm.partition", "blanks"),
    ("slurm-extra-two-lines", 'slurm: {extra_sbatch: ["--a\\n--b"]}\n', "slurm.extra_sbatch[0]", "invalid sbatch option"),
    ("slurm-extra-not-option", "slurm: {extra_sbatch: [touch /tmp/x]}\n", "slurm.extra_sbatch[0]", "invalid sbatch option"),
    ("slurm-setup-newline", 'slurm: {setup: ["a\\ntouch /tmp/x"]}\n', "slurm.setup[0]", "one shell line"),
    ("openpai-name-newline", 'openpai: {name: "x\\n"}\n', "openpai.name", "OpenPAI job names"),
    ("openpai-role-newline", 'openpai: {task_role: "w\\n"}\n', "openpai.task_role", "letters, digits"),
    ("openpai-image-moved", "openpai: {image: 'a:1'}\n", "openpai.image", "moved to the job-level 'container"),
    ("container-image-space", "container: {image: 'a b'}\n", "container.image", "not an image reference"),
    ("container-image-comma", "container: {image: 'a,b'}\n", "container.image", "not an image reference"),
    ("container-image-dotdot", "container: {image: '/x/../y'}\n", "container.image", "'..' parts"),
    ("container-image-dash", "container: {image: '-v'}\n", "container.image", "not an image reference"),
    ("container-image-missing", "container: {mounts: ['/a:/b']}\n", "container.image", "needs an image"),
    ("container-image-null", "container: {image: null}\n", "container.image", "needs an image"),
    ("container-image-tilde", "container: {image: ~, runtime: oci}\n", "container.image", "needs an image"),
    ("container-empty", "container: {}\n", "container.image", "needs an image"),
    ("container-mount-relative", "container: {image: i, mounts: ['data:/data']}\n", "container.mounts[0]", "absolute"),
    ("container-mount-comma", "container: {image: i, mounts: ['/a,b:/data']}\n", "container.mounts[0]", "separator"),
    ("container-mount-colons", "container: {image: i, mounts: ['/a:/b:/c:ro']}\n", "container.mounts[0]", "HOST:CONTAINER"),
    ("container-mount-one-part", "container: {image: i, mounts: ['/a']}\n", "container.mounts[0]", "HOST:CONTAINER"),
    ("container-mount-flag", "container: {image: i, mounts: ['/a:/b:rx']}\n", "container.mounts[0]", "mount flag"),
    ("container-mount-dotdot", "container: {image: i, mounts: ['/a:/b/../etc']}\n", "container.mounts[0]", "'..'"),
    ("container-mount-not-list", "container: {image: i, mounts: '/a:/b'}\n", "container.mounts", "expected a list"),
    ("container-workdir-relative", "container: {image: i, workdir: w}\n", "container.workdir", "absolute"),
    ("container-workdir-colon", "container: {image: i, workdir: '/w:x'}\n", "container.workdir", "separator"),
    ("container-runtime-unknown", "container: {image: i, runtime: docker}\n", "container.runtime", "expected one of"),
    ("container-runtime-typo", "container: {image: i, runtime: pyxsi}\n", "container.runtime", "did you mean 'pyxis'"),
    ("container-env-bad-name", "container: {image: i, env: ['A-B']}\n", "container.env[0]", "variable name"),
    ("container-env-mapping", "container: {image: i, env: {A: b}}\n", "container.env", "expected a list"),
    ("container-launcher-relative", "container: {image: i, launcher: x.pyz}\n", "container.launcher", "absolute"),
    ("container-mount-home-text", "container: {image: i, mount_home: 'yes'}\n", "container.mount_home", "true/false"),
    ("container-unknown-key", "container: {image: i, imgae: j}\n", "container.imgae", "unknown key"),
    ("openpai-param-name", "openpai: {parameters: {a-b: x}}\n", "openpai.parameters", "parameter name"),
    ("openpai-port-reserved", "openpai: {port_label: ssh}\n", "openpai.port_label", "reserved"),
    ("ssh-interface-newline", 'ssh: {interface: "eth0\\n"}\n', "ssh.interface", "interface"),
    ("ssh-env-allow-newline", 'ssh: {env_allow: ["WANDB_*\\n"]}\n', "ssh.env_allow[0]", "variable names"),
    ("ssh-user-dash", "ssh: {user: -oProxyCommand=x}\n", "ssh.user", "not a user name"),
    ("ssh-host-option", "ssh: {hosts: [-oProxyCommand=x]}\n", "ssh.hosts[0]", "not a host name"),
    ("ssh-host-slots-zero", "ssh: {hosts: [a slots=0]}\n", "ssh.hosts[0]", "slots must be"),
    ("ssh-host-slots-huge", "ssh: {hosts: ['a slots=100000000000000000000000000']}\n", "ssh.hosts[0]", "slots must be"),
    ("ssh-host-slots-over-bound", "ssh: {hosts: ['a:1000']}\n", "ssh.hosts[0]", "over the bound"),
    ("ssh-host-two", "ssh: {hosts: ['a b']}\n", "ssh.hosts[0]", "unknown option"),
    ("ssh-host-comment", "ssh: {hosts: ['a #x']}\n", "ssh.hosts[0]", "one host per entry"),
    ("unknown-key-newline", '"a\\nb": 1\n', "", "unknown key"),
    ("unknown-key-huge", f"{'k' * 300}: 1\n", "", "unknown key"),
    ("unknown-key-int", "1: x\n", "", "unknown key"),
    ("unknown-key-list", "? [a]\n: b\n", "", "expected a single value"),
    ("unknown-key-typo", "nprocs_per_node: 2\n", "nprocs_per_node", "did you mean 'nproc_per_node'"),
    ("args-string", "args: --lr\n", "args", "expected a list"),
    ("args-nested", "args: [[a]]\n", "args[0]", "expected a string, got a list"),
    ("args-recursive-alias", "args: &a [*a]\n", "args[0]", "expected a string, got a list"),
    ("args-bool", "args: [yes]\n", "args[0]", "expected a string, got bool"),
    ("env-list", "env: [A, B]\n", "env", "expected a mapping"),
    ("ssh-null", "ssh: ~\n", "ssh", "expected a mapping"),
    ("nodes-quoted", "nodes: '2'\n", "nodes", "expected an integer"),
    ("backend-huge", f"backend: {'g' * 100000}\n", "backend", "expected one of"),
    ("backend-list", "backend: [gloo]\n", "backend", "expected a single value"),
]

CASES = EXPLICIT + _generated()


def _check_line(message: str, path: Path, line: int | None, key: str) -> None:
    """The promised shape: ``path:line: key: problem``, one line, bounded, no raw controls."""
    where = f"{path}:{line}: " if line else f"{path}: "
    assert message.startswith(where + (f"{key}: " if key else "")), message[:300]
    assert len(message) <= MAX_MESSAGE_CHARS, len(message)
    assert validate.control_problem(message) is None, repr(message[:300])


@pytest.mark.parametrize("name,body,key,fragment", CASES, ids=[c[0] for c in CASES])
def test_hostile_job_file_is_one_line_naming_file_line_and_key(tmp_path: Path, name: str, body: str,
                                                               key: str, fragment: str) -> None:
    """Each hostile job file raises one JobSpecError ``file:line: key: problem``, bounded, no raw controls."""
    path = tmp_path / "job.yaml"
    path.write_text(SCRIPT + body, encoding="utf-8")
    with pytest.raises(JobSpecError) as info:
        load_job(path)
    message = str(info.value)
    _check_line(message, path, 2, key)
    assert fragment in message, message[:300]
    assert not (tmp_path / "logs").exists()


def test_the_table_is_large_enough() -> None:
    """The issue asks for at least 150 hostile job-file cases."""
    assert len(CASES) >= 150, len(CASES)


def test_script_field_with_controls_is_refused(tmp_path: Path) -> None:
    """``script:`` with a newline or NUL is refused by the path rule before the file is looked up."""
    for value in ("a\nb.py", "a\x00b.py", "a\u2028b.py", ""):
        path = tmp_path / "job.yaml"
        path.write_text(f"script: {json.dumps(value)}\n")
        with pytest.raises(JobSpecError) as info:
            load_job(path)
        _check_line(str(info.value), path, 1, "script")


# A fragment of "" where a third party may refuse first in its own words: 20,000 open brackets
# meet libyaml's own depth limit (PyYAML >= 6.0.4) before ours; 200 maps are within its limit.
FILE_LEVEL = [
    ("deep-lists", SCRIPT + "args: " + "[" * 20000 + "\n", 2, ""),
    ("deep-maps", SCRIPT + "env: " + "{a: " * 200 + "\n", 2, "nested deeper than"),
    ("raw-escape", SCRIPT + "name: a\x1bb\n", 2, "character 0x001b is not allowed"),
    ("raw-nul", SCRIPT + "name: a\x00b\n", 2, "is not allowed"),
    ("syntax", SCRIPT + "args: [unclosed\n", 3, "invalid YAML"),
    ("tab-indent", SCRIPT + "ssh:\n\tport: 2\n", 3, "invalid YAML"),
    ("undefined-handle", SCRIPT + "name: !x!y z\n", 2, "invalid YAML"),
    ("alias-undefined", SCRIPT + "args: *nope\n", 2, "invalid YAML"),
    ("two-documents", SCRIPT + "---\nname: b\n", 2, "invalid YAML"),
]


@pytest.mark.parametrize("name,text,line,fragment", FILE_LEVEL, ids=[f[0] for f in FILE_LEVEL])
def test_broken_yaml_is_one_line_with_its_line(tmp_path: Path, name: str, text: str, line: int, fragment: str) -> None:
    """Parser-level attacks (20,000-deep nesting, raw control bytes, syntax) name file:line, never a RecursionError."""
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(JobSpecError) as info:
        load_job(path)
    _check_line(str(info.value), path, line, "")
    assert fragment in str(info.value)


@pytest.mark.parametrize("name,text,line,fragment", FILE_LEVEL, ids=[f[0] for f in FILE_LEVEL])
def test_broken_yaml_on_the_command_line_is_one_line_exit_2(tmp_path: Path, name: str, text: str, line: int,
                                                            fragment: str) -> None:
    """``clusterddp run`` of each parser-level attack: exit 2, one stderr line naming file:line, no traceback."""
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    result = cli("run", str(path), "--dry-run", cwd=tmp_path, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clusterddp: error: {path}:{line}: "), lines[:3]


def test_not_a_regular_file_is_refused_without_reading(tmp_path: Path) -> None:
    """/dev/zero, a FIFO (no writer: would hang), a directory and /dev/null are refused at once."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    for path in ("/dev/zero", str(fifo), str(tmp_path), "/dev/null", str(link)):
        with pytest.raises(JobSpecError) as info:
            load_job(path)
        message = str(info.value)
        assert message.startswith(f"{path}: the job file is "), message
        assert "regular file" in message or "directory" in message


def test_oversized_and_binary_files(tmp_path: Path) -> None:
    """Over MAX_JOB_FILE_BYTES is refused by size (never echoed); bytes that are not UTF-8 name their line."""
    big = tmp_path / "big.yaml"
    big.write_text(SCRIPT + "name: " + "x" * (50 << 20) + "\n")
    with pytest.raises(JobSpecError) as info:
        load_job(big)
    assert str(info.value) == f"{big}: the job file is {big.stat().st_size} bytes (at most {validate.MAX_JOB_FILE_BYTES})"
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(SCRIPT.encode() + b"name: x\nargs: [\xff\xfe]\n")
    with pytest.raises(JobSpecError) as info:
        load_job(binary)
    assert str(info.value).startswith(f"{binary}:3: not UTF-8 text (byte 0xff)")


def test_job_path_with_a_newline_is_refused(tmp_path: Path) -> None:
    """A job file whose path holds a newline is refused with the path escaped: the line stays one line."""
    path = tmp_path / "a\nb.yaml"
    path.write_text(SCRIPT)
    with pytest.raises(JobSpecError) as info:
        load_job(path)
    assert "\n" not in str(info.value) and "control character" in str(info.value)


def test_the_bound_on_workers_can_be_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLUSTERDDP_MAX_WORKERS_PER_NODE is the documented way past the bound of 256 workers per node."""
    path = tmp_path / "job.yaml"
    path.write_text(SCRIPT + "nproc_per_node: 300\n")
    with pytest.raises(JobSpecError):
        load_job(path)
    monkeypatch.setenv(validate.MAX_WORKERS_ENV, "512")
    assert load_job(path).nproc_per_node == 300


def test_good_values_still_load(tmp_path: Path) -> None:
    """Strict rules refuse nothing legitimate: newlines and tabs in args and env values, IPv6, anchors."""
    path = tmp_path / "job.yaml"
    path.write_text(SCRIPT + 'name: good.job-1\n'
                    'args: ["multi\\nline", "tab\\there", "ünïcode", "$(not run)"]\n'
                    'env: {A: "x\\ny", B_2: ""}\n'
                    'master: {addr: "fe80::1", port: 65535}\n'
                    "ssh: {port: &p 22, hosts: ['admin@n1:2', '[::1]:1'], link_timeout: 0.5}\n"
                    "slurm: {cpus_per_task: *p}\n", encoding="utf-8")
    job = load_job(path)
    assert job.args[0] == "multi\nline" and job.env["A"] == "x\ny" and job.master.addr == "fe80::1"
    assert job.ssh.hosts == ("admin@n1:2", "[::1]:1") and job.slurm.cpus_per_task == 22
    assert job.ssh.link_timeout == 0.5


# --- Through the real CLI: exit 2, exactly one stderr line, no logs dir, no worker started.

CLI_CASES = [c for c in EXPLICIT if c[0] in {
    "tag-foo", "tag-python-name", "nproc-1e26", "nproc-100k", "nodes-1e26", "sig-kill", "sig-stop", "sig-dfl",
    "sig-ign", "sig-term", "name-newline", "env-key-newline", "int-5000-digits", "master-addr-option",
    "slurm-setup-newline", "ssh-host-option", "unknown-key-newline", "backend-huge", "ssh-link-tiny",
    "ssh-link-nan"}]
CLI_CASES += [(f"gen-{c[0]}", c[1], c[2], c[3]) for c in _generated() if c[0] in {
    "args[0]-nul", "env.A-nul", "python-nul", "args[0]-huge", "logs.dir-newline", "name-esc"}]


@pytest.mark.parametrize("name,body,key,fragment", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_rejects_in_one_line_and_starts_nothing(tmp_path: Path, name: str, body: str, key: str,
                                                    fragment: str) -> None:
    """``clusterddp run`` on a hostile file: rc 2, exactly one stderr line naming file:line: key, no logs, no worker."""
    marker = tmp_path / "worker-started"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    path = tmp_path / "job.yaml"
    extra = "" if "nproc_per_node" in body else "nproc_per_node: 1\n"
    path.write_text(f"script: {script}\n" + body + extra, encoding="utf-8")
    result = cli("run", str(path), cwd=tmp_path, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    where = f"clusterddp: error: {path}:2: " + (f"{key}: " if key else "")
    assert result.stderr.startswith(where), result.stderr[:300]
    assert not (tmp_path / "logs").exists() and not marker.exists()


@pytest.mark.parametrize("job_file", ["/dev/zero", "FIFO", "DIR"])
def test_cli_special_files_do_not_hang(tmp_path: Path, job_file: str) -> None:
    """``clusterddp run /dev/zero`` or a FIFO with no writer returns at once: one line, rc 2."""
    if job_file == "FIFO":
        job_file = str(tmp_path / "fifo.yaml")
        os.mkfifo(job_file)
    elif job_file == "DIR":
        job_file = str(tmp_path)
    result = cli("run", job_file, cwd=tmp_path, timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "regular file" in result.stderr or "directory" in result.stderr


# --- Properties: whatever the bytes or the values, only JobSpecError (or a valid JobSpec).

_LEAF = (st.text(max_size=40) | st.integers() | st.floats() | st.booleans() | st.none()
         | st.sampled_from(["SIGKILL", "SIG_IGN", "auto", "-x", "a\nb", "\x00", "9" * 30, "..", "!!", "&a"]))
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _load_text(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "job.yaml"
        path.write_bytes(data)
        try:
            load_job(path)
        except JobSpecError as exc:
            message = str(exc)
            assert message.startswith(str(path)) and len(message) <= MAX_MESSAGE_CHARS
            assert validate.control_problem(message) is None, repr(message)


@_SETTINGS
@given(st.text(max_size=400))
def test_any_text_is_a_job_or_one_line(text: str) -> None:
    """Arbitrary text as a job file never raises anything but one JobSpecError line."""
    _load_text(text.encode("utf-8", "surrogatepass"))


@_SETTINGS
@given(st.binary(max_size=400))
def test_any_bytes_are_a_job_or_one_line(data: bytes) -> None:
    """Arbitrary bytes as a job file never raise anything but one JobSpecError line."""
    _load_text(data)


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    import dataclasses
    import typing

    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = prefix + f.name
        keys.append(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(_all_keys(hints[f.name], key + "."))
    return keys


ALL_KEYS = _all_keys(JobSpec)


@_SETTINGS
@given(st.sampled_from(ALL_KEYS), _VALUE, st.sampled_from(ALL_KEYS), _VALUE)
def test_any_value_in_any_field_is_a_job_or_one_line(key: str, value: object, key2: str, value2: object) -> None:
    """Arbitrary values in any two fields never raise anything but one JobSpecError line."""
    data: dict[str, object] = {"script": str(REPO / "jobs" / "hello.py")}
    for k, v in ((key, value), (key2, value2)):
        section, _, leaf = k.partition(".")
        if leaf:
            target = data.setdefault(section, {})
            if isinstance(target, dict):
                target[leaf] = v
        else:
            data[section] = v
    _load_text(yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass"))


# --- Checks that run after loading still name file:line and key (not a flag, not only the file).

#: (id, argv after the job file's path, job body after 'script:' (line 1), expected text after
#: 'clusterddp: error: JOB:'). Each body puts the culprit on a known line.
LATE_CASES = [
    ("passthrough-unset", ["run", "JOB", "--dry-run"],
     "env_passthrough:\n  - HOME\n  - CLUSTERDDP_TEST_UNSET_SECRET\n",
     "4: env_passthrough[1]: CLUSTERDDP_TEST_UNSET_SECRET is not set"),
    ("passthrough-unset-sbatch", ["submit", "slurm", "JOB"],
     "env_passthrough: [HOME,\n  CLUSTERDDP_TEST_UNSET_SECRET]\n",
     "3: env_passthrough[1]: CLUSTERDDP_TEST_UNSET_SECRET is not set"),
    ("ssh-hosts-twice", ["run", "JOB", "--dry-run"],
     "ssh:\n  hosts:\n    - node-a\n    - node-b\n    - node-a:2\n",
     "6: ssh.hosts[2]: host 'node-a' is listed twice (first at "),
    ("ssh-include-no-match", ["run", "JOB", "--dry-run"],
     "ssh:\n  hosts: [node-a, node-b]\n  include:\n    - node-a\n    - gpu*\n",
     "6: ssh.include[1]: 'gpu*' matches no host"),
    ("ssh-exclude-no-match", ["run", "JOB", "--dry-run"],
     "ssh:\n  hosts: [node-a, node-b]\n  exclude: [gpu*]\n",
     "4: ssh.exclude[0]: 'gpu*' matches no host"),
    ("openpai-setup-comment", ["render", "openpai", "JOB"],
     "container:\n  image: img\nopenpai:\n  setup:\n    - cd /work\n    - 'pip install x  # pin later'\n",
     "7: openpai.setup[1]: "),
    ("slurm-env-and-passthrough", ["render", "slurm", "JOB"],
     "env_passthrough: [TOKEN_X]\nenv:\n  A: '1'\n  TOKEN_X: '2'\n",
     "5: env.TOKEN_X: TOKEN_X is also in env_passthrough"),
]


@pytest.mark.parametrize("name,argv,body,expected", LATE_CASES, ids=[c[0] for c in LATE_CASES])
def test_late_errors_name_file_line_and_key(tmp_path: Path, name: str, argv: list[str], body: str,
                                            expected: str) -> None:
    """Errors found after loading (unset passthrough, duplicate host, include, render checks) name file:line: key."""
    path = tmp_path / "job.yaml"
    (tmp_path / "t.py").write_text("")
    path.write_text("script: t.py\n" + body, encoding="utf-8")
    result = cli(*[str(path) if a == "JOB" else a for a in argv], cwd=tmp_path, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"clusterddp: error: {path}:{expected}"), result.stderr


def test_an_include_flag_is_named_as_the_flag(tmp_path: Path) -> None:
    """--include that matches nothing is reported as --include, the job's own as ssh.include."""
    path = tmp_path / "job.yaml"
    (tmp_path / "t.py").write_text("")
    path.write_text("script: t.py\nssh:\n  hosts: [node-a]\n", encoding="utf-8")
    result = cli("run", str(path), "--include", "gpu*", "--dry-run", cwd=tmp_path, timeout=600)
    assert result.returncode == 2 and result.stderr.startswith("clusterddp: error: --include 'gpu*' matches no host"), \
        result.stderr


def test_a_container_without_an_image_renders_nothing(tmp_path: Path) -> None:
    """``container: {image: null}``: render slurm exits 2 with one line naming file:line: container.image (was a bare sbatch script)."""
    path = tmp_path / "job.yaml"
    path.write_text(SCRIPT + "container:\n  runtime: oci\n  image: null\n", encoding="utf-8")
    result = cli("render", "slurm", str(path), cwd=tmp_path, timeout=600)
    assert result.returncode == 2 and result.stdout == "", result.stdout[-500:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"clusterddp: error: {path}:4: container.image: missing"), result.stderr

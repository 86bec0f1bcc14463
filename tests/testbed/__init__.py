"""Real test beds on one machine: hosts as network namespaces, each with its own sshd.

Nothing here is mocked: the namespaces, the bridge, the sshd daemons, the keys and the
known_hosts file are real, so the SSH code is tested the way it runs on a bare cluster.
"""

from tests.testbed.netns import LabHost, SSHLab, lab_unavailable_reason, ssh_lab

__all__ = ["LabHost", "SSHLab", "lab_unavailable_reason", "ssh_lab"]

"""One meaning per word (issue 36, goal 5; docs/architecture.md, "One meaning per word"): the
words two things used to share are kept apart where a test can see it."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "clusterddp"
#: "heartbeat" is a rank's progress; the SSH head's beat on stdin is a "keepalive".
SSH_SIDE = [*sorted((PACKAGE / "launch" / "ssh").glob("*.py")), PACKAGE / "launch" / "supervise" / "watch.py",
            PACKAGE / "sections" / "ssh.py", REPO / "docs" / "ssh.md"]
RANK_HEARTBEAT = re.compile(r"heartbeat(\(| file|_file)|HEARTBEAT_FILE|import heartbeat", re.I)


def _lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text().splitlines(), 1))


def test_the_ssh_side_says_keepalive_not_heartbeat() -> None:
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in SSH_SIDE for n, line in _lines(path)
             if re.search(r"heartbeat", line, re.I) and not RANK_HEARTBEAT.search(line)]
    assert found == []


def test_no_launch_module_is_named_for_a_word_that_means_something_else() -> None:
    """``report`` is the command (clusterddp report), ``record`` a registry's run record."""
    names = sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "launch").rglob("*.py")
                   if p.stem in ("report", "record"))
    assert names == []


def test_the_flags_say_what_they_carry() -> None:
    flags = (PACKAGE / "launch" / "flags.py").read_text()
    for old in ("--report-json", "--record-dir", "--heartbeat-timeout"):
        assert old not in flags

"""What the run record says about the code besides its tree hash: the git commit it started
from and the uncommitted diff, when ``code.dir`` is in a git work tree and git is installed
(both optional: a tarball or a machine without git ships the same, with no commit).

The diff is scrubbed (``redact.scrub``: registered secrets masked) and cut at
``MAX_DIFF_BYTES``: a record, not a backup; the tree hash is what identifies the code.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from clusterddp.redact import scrub

#: The diff kept in the run record; beyond it, cut with a note (the tree hash stays exact).
MAX_DIFF_BYTES = 256 << 10


@dataclass(frozen=True)
class GitState:
    """The commit (None: not a git work tree, or no git) and the uncommitted changes."""

    commit: str | None = None
    #: ``git diff HEAD`` (staged and unstaged, tracked files), scrubbed and cut.
    diff: str = ""
    #: Untracked files that were shipped (not in the diff), by name.
    untracked: tuple[str, ...] = ()

    @property
    def dirty(self) -> bool:
        return bool(self.diff or self.untracked)


def git_state(directory: str) -> GitState:
    """The work tree's state, or an empty one when there is no git or no work tree."""
    if shutil.which("git") is None:
        return GitState()
    commit = _git(directory, "rev-parse", "--verify", "HEAD")
    if commit is None:
        return GitState()
    diff = _git(directory, "diff", "--no-color", "--no-ext-diff", "HEAD", "--", ".") or ""
    if len(diff.encode()) > MAX_DIFF_BYTES:
        diff = diff.encode()[:MAX_DIFF_BYTES].decode("utf-8", "replace") + "\n[diff cut at 256 KiB]\n"
    untracked = (_git(directory, "ls-files", "--others", "--exclude-standard", "--", ".") or "").splitlines()
    return GitState(commit=commit.strip(), diff=scrub(diff), untracked=tuple(untracked[:200]))


def _git(directory: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", directory, *args], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None

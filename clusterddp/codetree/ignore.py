"""Which paths of a code tree stay home: the subset of gitignore(5) that real trees use.

Implemented here rather than asked of ``git check-ignore`` / ``git ls-files``: the result
must be the same on a machine without git, in a directory that is not a repository (a
tarball, a copy), and for ``code.exclude`` (which git knows nothing of); and one git call per
run costs more than matching a few patterns in the walk that reads every name anyway.

Supported, as git reads them: blank lines and ``#`` comments; ``\\#`` / ``\\!`` escapes;
trailing spaces dropped; ``!`` negation (last match wins); a trailing ``/`` matches
directories only; a ``/`` at the start or in the middle anchors the pattern at the directory
of its ``.gitignore`` (else it matches a name at any depth below it); ``*``, ``?``,
``[...]`` (``[!...]``) never match ``/``; ``**/`` leading, ``/**`` trailing and ``/**/``
in the middle. As in git, nothing under an ignored directory can be re-included (the walk
does not enter it). Not supported: ``core.excludesFile`` and ``.git/info/exclude`` (a
user's own, not the project's), ``.gitattributes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Rule:
    """One pattern line, compiled; ``base`` is the directory (relative to the tree's root,
    ``""`` for the root) of the file it came from."""

    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    base: str
    text: str

    def matches(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative to the tree's root, ``/``-separated) matches."""
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not path.startswith(self.base + "/"):
                return False
            path = path[len(self.base) + 1:]
        return self.regex.fullmatch(path) is not None


def parse(lines: Iterable[str], base: str = "") -> list[Rule]:
    """The rules of a ``.gitignore`` (or of ``code.exclude``, one pattern per item) whose
    directory is ``base``."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line or line.startswith("#"):
            continue
        line = _strip_trailing_spaces(line)
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = re.compile(body if anchored else "(?:.*/)?" + body, re.DOTALL)
        rules.append(Rule(regex, negated, dir_only, base, raw.strip()))
    return rules


def _strip_trailing_spaces(line: str) -> str:
    """Trailing spaces go unless escaped with a backslash (git's rule)."""
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    return line.replace("\\ ", " ") if line.endswith("\\ ") else line


def _translate(pattern: str) -> str:
    """A gitignore glob as a regular expression over a ``/``-separated relative path."""
    out: list[str] = []
    parts = pattern.split("/")
    last = len(parts) - 1
    for index, part in enumerate(parts):
        if part == "**":
            if index == last:
                out.append(".*")  # "a/**": everything inside a
            else:
                out.append("(?:.*/)?")  # "**/b", "a/**/b": zero or more directories
            continue
        out.append(_glob(part))
        if index != last:
            out.append("/")
    return "".join(out)


def _glob(part: str) -> str:
    """One path component's glob: ``*``, ``?`` and ``[...]`` never cross a ``/``."""
    out: list[str] = []
    i, n = 0, len(part)
    while i < n:
        c = part[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(part[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = part.find("]", i + 2 if part[i + 1:i + 2] in ("!", "^", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                inner = part[i + 1:end]
                if inner[:1] in ("!", "^"):
                    inner = "^" + inner[1:]
                out.append("[" + inner.replace("\\", "\\\\").replace("/", "") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def ignored(rules: Sequence[Rule], path: str, is_dir: bool) -> bool:
    """Whether ``path`` is ignored: the last rule that matches decides (a ``!`` rule keeps it)."""
    verdict = False
    for rule in rules:
        if rule.matches(path, is_dir):
            verdict = not rule.negated
    return verdict

"""sbatch's own reading of a batch script, ported line for line from slurm's src/sbatch/opt.c
(``next_line``, ``get_argument``, ``_opt_batch_script``; 22.05, the version the test bed runs).

The hostile tests use it to say exactly which arguments sbatch would take from the ``#SBATCH``
lines of a rendered script; where the real ``sbatch`` is installed they check it agrees.
"""

from __future__ import annotations

_SPACE = b" \t\n\v\f\r"


class Fatal(Exception):
    """sbatch would stop with ``fatal()`` (unmatched quote, a leading ':')."""


def _get_argument(line: bytes, start: int) -> tuple[bytes | None, int]:
    ptr = start
    while ptr < len(line) and line[ptr] in _SPACE:
        ptr += 1
    rest = line[ptr:]
    for word in (b"packjob", b"hetjob"):
        n = len(word)
        if rest[:n].lower() == word and (len(rest) == n or rest[n] in _SPACE):
            line = line[:ptr] + b" " * n + line[ptr + n:]
    if ptr < len(line) and line[ptr:ptr + 1] == b":":
        raise Fatal("unexpected ':'")
    if ptr >= len(line):
        return None, ptr
    out = bytearray()
    quoted, q_char, escape = False, 0, False
    while ptr < len(line) and (quoted or line[ptr] not in _SPACE) and line[ptr] != 0x0A:
        char = line[ptr]
        if escape:
            escape = False
        elif char == 0x5C:  # backslash
            escape = True
            ptr += 1
            continue
        elif quoted:
            if char == q_char:
                quoted = False
                ptr += 1
                continue
        elif char in (0x22, 0x27):
            quoted, q_char = True, char
            ptr += 1
            continue
        elif char == 0x23:  # an unquoted '#': the rest of the line is a comment
            break
        out.append(char)
        ptr += 1
    if quoted:
        raise Fatal("unmatched quote")
    return (bytes(out) if out else None), ptr


def directive_arguments(script: str) -> list[str]:
    """The arguments sbatch builds from the script's ``#SBATCH`` lines, in order."""
    args: list[str] = []
    for raw in script.encode("utf-8").split(b"\n"):
        if raw.startswith(b"#SBATCH"):
            ptr = len(b"#SBATCH")
        elif raw.startswith(b"#SLURM"):
            ptr = len(b"#SLURM")
        else:
            stripped = raw.lstrip(_SPACE)
            if stripped and not stripped.startswith(b"#"):
                break  # the first command line: sbatch reads no directive after it
            continue
        while True:
            argument, ptr = _get_argument(raw, ptr)
            if argument is None:  # sbatch stops reading the line at the first empty argument
                break
            args.append(argument.decode("utf-8", "surrogateescape"))
    return args


def directive_lines_after_commands(script: str) -> list[str]:
    """``#SBATCH`` lines that come after the first command line (sbatch ignores them)."""
    seen_command, late = False, []
    for line in script.split("\n"):
        stripped = line.lstrip(" \t\v\f\r")
        if seen_command and line.startswith("#SBATCH"):
            late.append(line)
        elif stripped and not stripped.startswith("#"):
            seen_command = True
    return late

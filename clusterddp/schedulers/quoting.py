"""Every value a renderer writes, checked and quoted for the exact place it lands.

The renderers build text for three readers: sbatch's ``#SBATCH`` parser, bash, and a YAML
parser (OpenPAI's spec, and any YAML manifest: ``yaml_scalar``, ``flow_mapping``). Each
context has one function here; a value that cannot be written exactly in its context is
refused with a one-line ``JobSpecError`` naming the key. These checks run at render time,
whatever the job-file loader let through, so a ``JobSpec`` built by hand is as safe as one
loaded from YAML.

sbatch's directive parser (src/sbatch/opt.c ``get_argument``, the same in 20.11 to 25.11):
a line starting with ``#SBATCH`` is split at blanks into arguments; ``'`` and ``"`` group
characters, blanks included; a backslash makes the next character literal; an unquoted ``#``
ends the line; parsing stops at the first line that is not a comment. The script itself may
hold no NUL byte and no CR LF pair (sbatch refuses the whole script).
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping


from clusterddp.errors import JobSpecError
from clusterddp.spec import JobSpec
from clusterddp.validate import (ECHO_CHARS, MAX_VALUE_CHARS, control_problem, env_name_problem, is_control, one_line_problem,
                                 parse_node_range, shown, text_problem, token_problem)

#: YAML strings that may stay unquoted: no indicator, no ': ', no '#', no ',' (flow maps); the
#: first character is no digit, sign or '.', so no reader takes it for a number or ``.inf``.
YAML_PLAIN = re.compile(r"[A-Za-z_/](?:[A-Za-z0-9_ ./=+@-]*[A-Za-z0-9_./=+@-])?")
#: Words that start with a letter and are not strings in some reader, in any case: YAML 1.1's
#: booleans (go-yaml v2, which kubectl reads manifests with, takes ``y`` and ``n`` too; PyYAML
#: does not) and nulls, and YAML 1.2 core's (``true``, ``null``: a subset).
YAML_WORDS = frozenset({"y", "yes", "n", "no", "true", "false", "on", "off", "null"})
#: Characters a double-quoted YAML scalar must escape beyond '"' and '\'.
YAML_LINE_BREAKS = {"\u0085", "\u2028", "\u2029", "\ufeff"}
#: Directive values written bare: nothing sbatch's parser or getopt would read differently.
DIRECTIVE_PLAIN = re.compile(r"[A-Za-z0-9_.,:/%@+=&^~-]+")
#: A long option as sbatch's getopt reads it (``--mail-type``).
LONG_OPTION = re.compile(r"--[a-z][a-z0-9-]*")
#: ``--name[=value]``, ``--name value`` or ``-X [value]`` in ``slurm.extra_sbatch``.
EXTRA_OPTION = re.compile(r"(--[a-z][a-z0-9-]*)(?:[= ][ \t]*(.*))?|(-[A-Za-z])(?:[ \t]*(.+))?", re.DOTALL)


def place(job_source: str | None, job_path: str) -> str:
    """Where errors say they come from: the job file's name, escaped when it is not one line."""
    where = job_source or job_path
    plain = isinstance(where, str) and len(where) <= 4 * ECHO_CHARS and not control_problem(where)
    return where if plain else shown(where)


def fail(where: str, key: str, problem: str, hint: str | None = None) -> JobSpecError:
    return JobSpecError(where, None, key, problem, hint)


def node_range(job: JobSpec, where: str) -> tuple[int, int]:
    """``nodes`` as (MIN, MAX), checked again here: a JobSpec built by hand was never loaded."""
    try:
        return parse_node_range(job.nodes)
    except ValueError as exc:
        raise JobSpecError(where, job.key_lines.get("nodes"), "nodes", str(exc)) from None


def directive_value(value: object, where: str, key: str) -> str:
    """``value`` for ``#SBATCH --flag=<here>``: bare when plainly safe, else in double quotes
    with ``"`` and ``\\`` escaped (exact in sbatch's parser); refused when it holds a control
    character (a line break ends the directive) or is empty."""
    if not isinstance(value, str) or not value:
        raise fail(where, key, f"must be a non-empty string, got {type(value).__name__} {shown(value)}")
    problem = control_problem(value) or text_problem(value, MAX_VALUE_CHARS)
    if problem:
        raise fail(where, key, problem, "an #SBATCH value is one line without control characters")
    if DIRECTIVE_PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def integer(value: object, where: str, key: str, minimum: int = 0, maximum: int | None = None) -> str:
    """A count written as digits; anything but a real int (a str, a bool) is refused, and so
    is one past ``maximum`` (bash's arithmetic is 64-bit)."""
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise fail(where, key, f"must be an integer {bounds}, got {shown(value)}")
    return str(value)


def comment_text(value: str, where: str, key: str) -> str:
    """Text inside a ``#`` comment line: no line break of any kind may end the comment early."""
    problem = control_problem(value) if isinstance(value, str) else "is not a string"
    if problem or len(value) > MAX_VALUE_CHARS:
        raise fail(where, key, problem or f"is {len(value)} characters long (at most {MAX_VALUE_CHARS})",
                   "it is written into the script's header comment, which must stay one line")
    return value


def path_word(value: str, where: str, key: str) -> str:
    """A path that appears in comments and as a shell word: one line, then ``shlex.quote``."""
    return shlex.quote(comment_text(value, where, key))


def shell_word(value: str, where: str, key: str) -> str:
    """Any text as one bash word on one line: ``shlex.quote`` when it has no control
    character, else bash's ``$'...'`` with every byte outside printable ASCII as ``\\xHH``
    (exact in any locale), so no line of the script ever holds part of a value. NUL is
    refused: no process argument or variable can hold it."""
    if not isinstance(value, str):
        raise fail(where, key, f"must be a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem:
        raise fail(where, key, problem)
    if not any(is_control(char) for char in value):
        return shlex.quote(value)
    out = []
    for char in value:
        if char in "\\'":
            out.append("\\" + char)
        elif " " <= char <= "~":
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
    return "$'" + "".join(out) + "'"


def env_name(name: str, where: str, key: str) -> str:
    problem = env_name_problem(name) if isinstance(name, str) else "is not a string"
    if problem:
        raise fail(where, key, problem)
    return name


def token(value: str, where: str, key: str, what: str = "a name") -> str:
    problem = token_problem(value, what) if isinstance(value, str) else "is not a string"
    if problem:
        raise fail(where, key, problem)
    return value


def setup_line(line: str, where: str, key: str) -> str:
    """A shell line by design (module load, source venv): exactly one line. It is written as
    ``eval 'LINE'`` so an unclosed quote, a trailing backslash or a here-document in it fails
    on its own and can never change how the lines after it parse."""
    problem = one_line_problem(line) if isinstance(line, str) else "is not a string"
    if problem is None and not line.strip():
        problem = "is empty"
    if problem:
        raise fail(where, key, problem, "one shell line per entry")
    return f"eval {shlex.quote(line)}"



def extra_directive(line: str, where: str, key: str) -> str:
    """One ``slurm.extra_sbatch`` entry as exactly one sbatch option: ``--name[=value]`` or
    ``-X value`` (a leading ``#SBATCH`` is dropped); the value is quoted like every other."""
    if not isinstance(line, str):
        raise fail(where, key, f"must be a string, got {type(line).__name__}")
    option = line.strip(" \t")
    if option.startswith("#SBATCH"):
        option = option[len("#SBATCH"):].strip(" \t")
    match = EXTRA_OPTION.fullmatch(option)
    if match is None or control_problem(option):
        raise fail(where, key, f"invalid sbatch option {shown(line)}",
                   "one option per entry, e.g. '--mail-type=END'")
    long_form = match.group(1) is not None
    name, value = (match.group(1), match.group(2)) if long_form else (match.group(3), match.group(4))
    if value is None:
        return name
    quoted = directive_value(value.rstrip(" \t"), where, key)
    return f"{name}={quoted}" if long_form else f"{name} {quoted}"


def option_name(directive: str) -> str:
    """``--export=ALL`` -> ``--export``."""
    return directive.split("=", 1)[0].split(" ", 1)[0]


def yaml_plain(value: str) -> bool:
    """Whether ``value`` may be written as a plain YAML scalar: it reads back as the same string
    in YAML 1.1 readers (PyYAML, go-yaml v2) and YAML 1.2 ones alike. ``0o17``, ``1e3`` and a
    commit hash like ``12345e6`` are strings to PyYAML but numbers to YAML 1.2 and to kubectl;
    ``y`` is a string to PyYAML but a boolean to kubectl: each must be quoted. Every YAML
    writer of the renderers asks this one question."""
    return YAML_PLAIN.fullmatch(value) is not None and value.lower() not in YAML_WORDS


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar that reads back as the same string in YAML 1.1 and 1.2."""
    if yaml_plain(value):
        return value
    out = ['"']
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and char not in YAML_LINE_BREAKS:
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def flow_mapping(values: Mapping[str, str]) -> str:
    """``{k: v, ...}`` on one line (``{}`` when empty), keys and values as safe scalars."""
    return "{" + ", ".join(f"{yaml_scalar(k)}: {yaml_scalar(v)}" for k, v in values.items()) + "}"

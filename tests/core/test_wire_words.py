"""Every file name and word two processes share is spelled once, in clusterddp/protocol.py.

Checked on the source of every module of ``clusterddp/`` (``ast``, nothing imported but
``protocol``): no string or bytes literal elsewhere equals one of protocol's words (its
constants that are more than a plain lower-case word) or a name its ``*_name`` functions make,
an f-string counting as its text with ``{}`` for each value (``f"rank{rank}.log"`` is
``rank{}.log``, which ``rank_file_name("{}", RANK_LOG)`` makes too). A path that ends in one
(``f"{run_dir}/rank{rank}.log"``, no white space) counts as well; prose naming a file does not. docs/architecture.md's table "The wire
words" names every one of them.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from clusterddp import protocol
from tests.conftest import REPO

#: Stand-ins for a name function's values that no name function changes (``events_copy_name``
#: replaces what a host name may not hold); replaced by ``{}`` afterwards.
_VALUE = "QQ{}QQ"
#: Name functions whose ``kind`` is one of protocol's constants with this prefix.
KINDS = {"rank_file_name": "RANK_", "mark_name": "RECORD_"}
#: The SSH stub spells its probe marker itself (protocol.py's docstring says why).
EXEMPT = {REPO / "clusterddp" / "launch" / "ssh" / "stub.py"}


def words() -> dict[str | bytes, str]:
    """protocol's constants that are words of their own (a plain lower-case word such as the
    kind ``log`` is one only inside a name), by value: the constant's name."""
    found: dict[str | bytes, str] = {}
    for name, value in vars(protocol).items():
        if name.isupper() and not name.startswith("_") and isinstance(value, (str, bytes)):
            text = value.decode() if isinstance(value, bytes) else value
            if len(text) > 1 and not re.fullmatch(r"[a-z]+", text):
                found[value] = name
                found[text] = name
    return found


def name_functions() -> list[str]:
    return sorted(name for name, value in vars(protocol).items()
                  if name.endswith("_name") and inspect.isfunction(value) and value.__module__ == protocol.__name__)


def names() -> dict[str, str]:
    """Every name shape protocol's ``*_name`` functions make, with ``{}`` for each value
    (and each ``kind`` they take): the function's name."""
    shapes: dict[str, str] = {}
    for name in name_functions():
        function = getattr(protocol, name)
        parameters = list(inspect.signature(function).parameters)
        kinds = [value for key, value in vars(protocol).items() if key.startswith(KINDS.get(name, "\0"))]
        for kind in [None, *kinds]:
            values = [kind if p == "kind" and kind is not None else _VALUE.format(i) for i, p in enumerate(parameters)]
            shapes[re.sub(r"QQ\d+QQ", "{}", function(*values))] = name
    return shapes


def _rendered(node: ast.JoinedStr) -> str:
    return "".join(part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "{}"
                   for part in node.values)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(source: str) -> list[tuple[int, str | bytes]]:
    """(line, text) of every string and bytes literal of ``source`` but docstrings; an
    f-string as one text with ``{}`` for each value."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found: list[tuple[int, str | bytes]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            found.append((node.lineno, _rendered(node)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in skip:
            found.append((node.lineno, node.value))
    return found


def respelled(source: str) -> list[tuple[int, str]]:
    """(line, what it spells again) for each literal of ``source`` that is one of protocol's
    words or names, or a path ending in one."""
    known: dict[str | bytes, str] = {**words(), **names()}
    problems = []
    for line, text in literals(source):
        for value, name in known.items():
            if isinstance(text, str) and isinstance(value, str):
                found = text == value or text.endswith("/" + value) and not re.search(r"\s", text)  # a path, not prose
            else:
                found = text == value
            if found:
                problems.append((line, f"{text!r} is protocol.{name}"))
                break
    return sorted(problems)


def test_no_module_spells_a_wire_word_again() -> None:
    """No literal outside protocol.py is a file name or wire word protocol spells."""
    problems = []
    for path in sorted((REPO / "clusterddp").rglob("*.py")):
        if path == REPO / "clusterddp" / "protocol.py" or path in EXEMPT:
            continue
        for line, what in respelled(path.read_text(encoding="utf-8")):
            problems.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not problems, "spell these through clusterddp/protocol.py:\n" + "\n".join(problems)


def test_the_check_sees_each_way_of_spelling_one() -> None:
    """A literal, an f-string, a path ending in a name and a struct format are all found;
    prose and a lone kind are not."""
    source = '''
"""The events.jsonl docstring is prose."""
a = "events.jsonl"
b = f"rank{rank}.log"
c = f"{run_dir}/attempt{k}.node{n}.end"
d = struct.Struct("!I")
e = b"CLUSTERDDP_RESULT "
f = f"events.node{node}.{host}.jsonl"
g = "log"
h = f"no rank {rank} here"
i = "the report reads logs/<run-id>/events.jsonl"
'''
    assert [line for line, _ in respelled(source)] == [3, 4, 5, 6, 7, 8]


def test_the_architecture_doc_names_every_wire_word() -> None:
    """docs/architecture.md's table "The wire words" names each constant and name function
    the check above knows (``RANK_*`` stands for every constant with that prefix)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## The wire words", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*\*?)(?:\(\))?`", table))
    prefixes = tuple(n[:-1] for n in named if n.endswith("*"))
    wanted = set(words().values()) | set(name_functions())
    missing = sorted(n for n in wanted if n not in named and not n.startswith(prefixes))
    assert not missing, f"docs/architecture.md, 'The wire words', does not name: {missing}"


def test_protocol_stays_cheap_to_load() -> None:
    """protocol.py imports only the standard library at its top (the worker bootstrap and the
    zygote load it by its path, in the job's python)."""
    tree = ast.parse(Path(protocol.__file__).read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    modules = {alias.name for node in top if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in top if isinstance(node, ast.ImportFrom)}
    assert modules <= {"__future__", "os", "signal", "time", "typing"}, modules

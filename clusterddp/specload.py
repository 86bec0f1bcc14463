"""Turn a YAML node tree into frozen dataclasses, with errors that name file, line and key.

Why not ``yaml.safe_load`` plus checks: a plain dict forgets where each value came from,
and a user with a 200-line job file needs ``jobs/x.yaml:17: ssh.port: ...``. So we walk
the composed node tree (which keeps line marks) and build the dataclasses from their type
hints. Each dataclass is the schema; nothing is declared twice.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Callable, Literal, Union

import yaml

from clusterddp.errors import JobSpecError
from clusterddp.validate import MAX_YAML_DEPTH, control_problem, escape_controls, shown, text_problem

#: Field metadata key: a function value -> error message (or None when the value is fine).
CHECK = "check"
#: Field metadata key: one sentence shown in docs and in "expected ..." messages.
DOC = "doc"
#: Field metadata key: set by the loader, never by the YAML (e.g. the file a spec came from).
INTERNAL = "internal"
#: Field metadata key: a check applied to each item of a list (or value of a mapping), so the
#: error names ``args[3]`` and that item's line.
EACH = "each"
#: Class attribute of a section dataclass: ``{old key: hint}`` for keys that moved, so a job
#: file written for an earlier version is told where the setting went, not only that it is unknown.
MOVED_KEYS = "MOVED_KEYS"
#: The only tags a job file may carry (the ones plain YAML resolves by itself). ``!foo`` or
#: ``!!python/name:os.system`` is refused by name, never handed to a constructor.
PLAIN_TAGS = frozenset("tag:yaml.org,2002:" + t for t in
                       ("str", "int", "float", "bool", "null", "seq", "map", "timestamp"))
#: Integers beyond a signed 64-bit value are typos or attacks (``nproc_per_node: 1e26`` as int).
MAX_INT = (1 << 63) - 1


def check(fn: Callable[[Any], str | None], doc: str = "") -> dict[str, Any]:
    """Metadata for ``dataclasses.field`` that adds a value check."""
    return {CHECK: fn, DOC: doc}


def check_each(fn: Callable[[Any], str | None], doc: str = "") -> dict[str, Any]:
    """Metadata for a list or mapping field whose every item (mapping: value) is checked."""
    return {EACH: fn, DOC: doc}


class NodeReader:
    """Builds dataclasses from YAML nodes of one file, remembering where each key was."""

    def __init__(self, path: str) -> None:
        self.path = path
        #: Line of every key read, by dotted path (list items as ``key[i]``, mapping entries
        #: as ``key.name``): later checks (a missing interpreter, a scheduler's rule, an unset
        #: passthrough variable) still point at the line that set the value.
        self.lines: dict[str, int] = {}

    def fail(self, node: yaml.Node | None, key: str, message: str, hint: str | None = None) -> JobSpecError:
        line = node.start_mark.line + 1 if node is not None else None
        return JobSpecError(self.path, line, key, message, hint)

    def build(self, cls: type, node: yaml.Node, key: str = "") -> Any:
        """Build dataclass ``cls`` from a mapping node; ``key`` is the dotted path so far."""
        self._check_tag(node, key)
        if not isinstance(node, yaml.MappingNode):
            what = " for the job file" if not key else ""
            raise self.fail(node, key, f"expected a mapping{what}, got {_describe(node)}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get(INTERNAL)}
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            name = self._scalar(key_node, key)
            if not isinstance(name, str) or name not in fields and (control_problem(name) or len(name) > 64):
                hint = "valid keys: " + ", ".join(sorted(fields))
                raise self.fail(key_node, key, f"unknown key {shown(name)}", hint)
            path = f"{key}.{name}" if key else name
            if name in seen:
                raise self.fail(key_node, path, f"duplicate key (first given on line {seen[name].start_mark.line + 1})")
            seen[name] = key_node
            self.lines[path] = key_node.start_mark.line + 1
            if name not in fields:
                moved = getattr(cls, MOVED_KEYS, {}).get(name)
                close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
                hint = moved or (f"did you mean '{close[0]}'?" if close else "valid keys: " + ", ".join(sorted(fields)))
                raise self.fail(key_node, path, "unknown key", hint)
            value = self.convert(hints[name], value_node, path)
            self._apply_checks(fields[name].metadata, value, value_node, path)
            values[name] = value
        missing = [n for n, f in fields.items() if _required(f) and n not in values]
        if missing:
            where = key or "the job file"
            raise self.fail(node, key, f"missing required key '{missing[0]}' in {where}")
        return cls(**values)

    def _apply_checks(self, metadata: Any, value: Any, node: yaml.Node, path: str) -> None:
        """The field's own check on the whole value, then its per-item check on each item."""
        checker = metadata.get(CHECK)
        if checker is not None and value is not None:
            problem = checker(value)
            if problem:
                raise self.fail(node, path, problem)
        each = metadata.get(EACH)
        if each is None or value is None:
            return
        if isinstance(node, yaml.SequenceNode):
            items = [(f"{path}[{i}]", item, n) for i, (item, n) in enumerate(zip(value, node.value))]
        else:
            items = [(f"{path}.{k.value}", value[k.value], v) for k, v in node.value]
        for item_path, item, item_node in items:
            problem = each(item)
            if problem:
                raise self.fail(item_node, item_path, problem)

    def _check_tag(self, node: yaml.Node, path: str) -> None:
        if node.tag not in PLAIN_TAGS:
            tag = "merge key '<<'" if node.tag.endswith(":merge") else f"tag {shown(node.tag)}"
            raise self.fail(node, path, f"YAML {tag} is not allowed in a job file",
                            "write the plain value; job files use no tags, anchors are fine")

    def convert(self, hint: Any, node: yaml.Node, path: str) -> Any:
        """Convert one node to the Python type ``hint`` or raise naming ``path``."""
        self._check_tag(node, path)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (Union, types.UnionType):
            return self._convert_union(args, node, path)
        if origin is Literal:
            value = self._scalar(node, path)
            if not isinstance(value, str) or value not in args:
                options = ", ".join(repr(a) for a in args)
                close = difflib.get_close_matches(str(value)[:64], [str(a) for a in args], n=1)
                raise self.fail(node, path, f"expected one of {options}, got {shown(value)}",
                                f"did you mean '{close[0]}'?" if close else None)
            return value
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self.build(hint, node, path)
        if origin is tuple:
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, path, f"expected a list, got {_describe(node)}")
            items = []
            for i, item in enumerate(node.value):
                self.lines[f"{path}[{i}]"] = item.start_mark.line + 1
                items.append(self.convert(args[0], item, f"{path}[{i}]"))
            return tuple(items)
        if origin is dict:
            if not isinstance(node, yaml.MappingNode):
                raise self.fail(node, path, f"expected a mapping, got {_describe(node)}")
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                name = self._scalar(key_node, path)
                if not isinstance(name, str) or not name:
                    raise self.fail(key_node, path, f"keys must be non-empty strings, got {shown(name)}")
                problem = control_problem(name) or text_problem(name, 128)
                if problem:
                    raise self.fail(key_node, path, f"key {shown(name)} {problem}")
                if name in out:
                    raise self.fail(key_node, f"{path}.{name}", "duplicate key")
                self.lines[f"{path}.{name}"] = key_node.start_mark.line + 1
                out[name] = self.convert(args[1], value_node, f"{path}.{name}")
            return types.MappingProxyType(out)
        return self._convert_scalar(hint, node, path)

    def _convert_union(self, args: tuple[Any, ...], node: yaml.Node, path: str) -> Any:
        if type(None) in args and isinstance(node, yaml.ScalarNode) and self._scalar(node, path) is None:
            return None
        candidates = [a for a in args if a is not type(None)]
        errors: list[JobSpecError] = []
        for candidate in candidates:
            try:
                return self.convert(candidate, node, path)
            except JobSpecError as exc:
                if candidate is int and _number_node(node):
                    raise  # a number that is no good integer: not to be read again as text
                errors.append(exc)
        if len(errors) == 1:  # 'X or nothing': the error about X is the precise one
            raise errors[0]
        expected = " or ".join(_type_name(a) for a in candidates)
        raise self.fail(node, path, f"expected {expected}, got {_describe(node)}")

    def _convert_scalar(self, hint: Any, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected {_type_name(hint)}, got {_describe(node)}")
        value = self._scalar(node, path)
        if _sexagesimal(node, value):
            # YAML 1.1 reads a plain 3:4 as the base-60 number 184 (and 1:30 as 90): never
            # what a job file means. As a string it is what was written ('nodes: 3:4').
            if hint is str:
                return node.value
            raise self.fail(node, path, f"{node.value} is YAML's base-60 number {value}, not {_type_name(hint)}",
                            f"quote it if you mean the text: \"{node.value}\"")
        if hint is bool:
            if isinstance(value, bool):
                return value
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                if abs(value) > MAX_INT:
                    raise self.fail(node, path, f"integer out of range: {shown(node.value)} (at most 2**63-1)")
                return value
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif hint is str:
            # Numbers are accepted where a string is expected (args: [--epochs, 2]); booleans
            # and nulls are not, because YAML's 'yes'/'no'/'~' would silently change meaning.
            if isinstance(value, str):
                problem = text_problem(value)
                if problem:
                    raise self.fail(node, path, problem)
                return value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return node.value
            raise self.fail(node, path, f"expected a string, got {_describe(node)}",
                            f"quote it: {shown(node.value)}")
        raise self.fail(node, path, f"expected {_type_name(hint)}, got {_describe(node)}")

    def _scalar(self, node: yaml.Node, path: str) -> Any:
        self._check_tag(node, path)
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected a single value, got {_describe(node)}")
        return _construct(node, lambda problem: self.fail(node, path, problem))


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting past MAX_YAML_DEPTH: PyYAML composes nodes by
    recursion, so ``[[[[...`` 20,000 deep would end in a RecursionError traceback."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


#: libyaml when PyYAML has it: the pure-Python scanner takes a minute over a 1 MiB job file.
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _check_depth(text: str) -> None:
    """Refuse nesting past MAX_YAML_DEPTH from the event stream (libyaml's parser keeps an
    explicit stack), before libyaml's composer recurses in C, where no RecursionError guards."""
    depth = 0
    if _FAST_LOADER is None:
        return
    for event in yaml.parse(text, Loader=_FAST_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  typing.cast(yaml.error.Mark, event.start_mark))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _compose(text: str) -> Any:
    if _FAST_LOADER is None:
        return yaml.compose(text, Loader=_BoundedLoader)
    _check_depth(text)
    return yaml.compose(text, Loader=_FAST_LOADER)


def compose(path: str, text: str) -> yaml.Node:
    """Parse YAML text into a node tree; syntax errors become one line with the position."""
    try:
        node = _compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = escape_controls(str(exc.problem or exc.context or "invalid YAML"))[:200]
        raise JobSpecError(path, line, "", f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise JobSpecError(path, line, "", f"invalid YAML: character {exc.character:#06x} is not allowed "
                           "(control characters must be written as escapes in a quoted string)") from None
    except yaml.YAMLError as exc:
        problem = escape_controls(str(exc).splitlines()[0] if str(exc) else "invalid YAML")[:200]
        raise JobSpecError(path, None, "", f"invalid YAML: {problem}") from None
    if node is None:
        raise JobSpecError(path, None, "", "the job file is empty")
    return typing.cast(yaml.Node, node)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _construct(node: yaml.ScalarNode, fail: Callable[[str], JobSpecError]) -> Any:
    """The Python value of a plain scalar; a value YAML cannot build (an integer of 5,000
    digits, a bad timestamp) becomes ``fail``'s one-line error instead of a traceback."""
    try:
        return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
        raise fail(f"cannot read the value {shown(node.value)}: {escape_controls(str(exc).splitlines()[0])[:120]}") from None


def _number_node(node: yaml.Node) -> bool:
    """A plain scalar YAML reads as a number (not a base-60 one: that is text, see below)."""
    if not isinstance(node, yaml.ScalarNode) or node.style:
        return False
    return node.tag.endswith((":int", ":float")) and ":" not in node.value


def _sexagesimal(node: yaml.Node, value: Any) -> bool:
    """A plain scalar with ':' that YAML 1.1 resolved to a number."""
    return (isinstance(node, yaml.ScalarNode) and not node.style and ":" in node.value
            and isinstance(value, (int, float)) and not isinstance(value, bool))


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag not in PLAIN_TAGS:
        return f"a value tagged {shown(node.tag)}"
    try:
        value = yaml.constructor.SafeConstructor().construct_object(node)
    except (yaml.YAMLError, ValueError, OverflowError, TypeError):
        return f"the value {shown(node.value)}"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {shown(node.value)}"


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "a list"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))

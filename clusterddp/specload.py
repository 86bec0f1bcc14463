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

#: Field metadata key: a function value -> error message (or None when the value is fine).
CHECK = "check"
#: Field metadata key: one sentence shown in docs and in "expected ..." messages.
DOC = "doc"
#: Field metadata key: set by the loader, never by the YAML (e.g. the file a spec came from).
INTERNAL = "internal"


def check(fn: Callable[[Any], str | None], doc: str = "") -> dict[str, Any]:
    """Metadata for ``dataclasses.field`` that adds a value check."""
    return {CHECK: fn, DOC: doc}


class NodeReader:
    """Builds dataclasses from YAML nodes of one file, remembering where each key was."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._constructor = yaml.constructor.SafeConstructor()
        #: Line of every key read, by dotted path: later checks (a missing interpreter, a
        #: scheduler's rule) still point at the line that set the value.
        self.lines: dict[str, int] = {}

    def fail(self, node: yaml.Node | None, key: str, message: str, hint: str | None = None) -> JobSpecError:
        line = node.start_mark.line + 1 if node is not None else None
        return JobSpecError(self.path, line, key, message, hint)

    def build(self, cls: type, node: yaml.Node, key: str = "") -> Any:
        """Build dataclass ``cls`` from a mapping node; ``key`` is the dotted path so far."""
        if not isinstance(node, yaml.MappingNode):
            what = " for the job file" if not key else ""
            raise self.fail(node, key, f"expected a mapping{what}, got {_describe(node)}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get(INTERNAL)}
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            name = self._scalar(key_node, key)
            path = f"{key}.{name}" if key else str(name)
            if not isinstance(name, str):
                raise self.fail(key_node, path, "keys must be strings")
            if name in seen:
                raise self.fail(key_node, path, f"duplicate key (first given on line {seen[name].start_mark.line + 1})")
            seen[name] = key_node
            self.lines[path] = key_node.start_mark.line + 1
            if name not in fields:
                close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'?" if close else "valid keys: " + ", ".join(sorted(fields))
                raise self.fail(key_node, path, "unknown key", hint)
            value = self.convert(hints[name], value_node, path)
            checker = fields[name].metadata.get(CHECK)
            if checker is not None and value is not None:
                problem = checker(value)
                if problem:
                    raise self.fail(value_node, path, problem)
            values[name] = value
        missing = [n for n, f in fields.items() if _required(f) and n not in values]
        if missing:
            where = key or "the job file"
            raise self.fail(node, key, f"missing required key '{missing[0]}' in {where}")
        return cls(**values)

    def convert(self, hint: Any, node: yaml.Node, path: str) -> Any:
        """Convert one node to the Python type ``hint`` or raise naming ``path``."""
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (Union, types.UnionType):
            return self._convert_union(args, node, path)
        if origin is Literal:
            value = self._scalar(node, path)
            if value not in args:
                options = ", ".join(repr(a) for a in args)
                close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
                raise self.fail(node, path, f"expected one of {options}, got {value!r}",
                                f"did you mean '{close[0]}'?" if close else None)
            return value
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self.build(hint, node, path)
        if origin is tuple:
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, path, f"expected a list, got {_describe(node)}")
            return tuple(self.convert(args[0], item, f"{path}[{i}]") for i, item in enumerate(node.value))
        if origin is dict:
            if not isinstance(node, yaml.MappingNode):
                raise self.fail(node, path, f"expected a mapping, got {_describe(node)}")
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                name = self._scalar(key_node, path)
                if not isinstance(name, str) or not name:
                    raise self.fail(key_node, path, f"keys must be non-empty strings, got {name!r}")
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
                errors.append(exc)
        if len(errors) == 1:  # 'X or nothing': the error about X is the precise one
            raise errors[0]
        expected = " or ".join(_type_name(a) for a in candidates)
        raise self.fail(node, path, f"expected {expected}, got {_describe(node)}")

    def _convert_scalar(self, hint: Any, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected {_type_name(hint)}, got {_describe(node)}")
        value = self._scalar(node, path)
        if hint is bool:
            if isinstance(value, bool):
                return value
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif hint is str:
            # Numbers are accepted where a string is expected (args: [--epochs, 2]); booleans
            # and nulls are not, because YAML's 'yes'/'no'/'~' would silently change meaning.
            if isinstance(value, str):
                return value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return node.value
            raise self.fail(node, path, f"expected a string, got {_describe(node)}",
                            f"quote it: '{node.value}'")
        raise self.fail(node, path, f"expected {_type_name(hint)}, got {_describe(node)}")

    def _scalar(self, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected a single value, got {_describe(node)}")
        return self._constructor.construct_object(node, deep=True)


def compose(path: str, text: str) -> yaml.Node:
    """Parse YAML text into a node tree; syntax errors become one line with the position."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise JobSpecError(path, line, "", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise JobSpecError(path, None, "", f"invalid YAML: {exc}") from None
    if node is None:
        raise JobSpecError(path, None, "", "the job file is empty")
    return node


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = yaml.constructor.SafeConstructor().construct_object(node)
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {node.value!r}"


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

"""What imports what (docs/architecture.md): the layers, checked on the source of every module.

Every module of ``clusterddp/`` (and ``templates/``, shipped as ``clusterddp.templates``) is
parsed with ``ast``; nothing is imported. A module belongs to a *unit*: the first name under
``clusterddp`` (``clusterddp.launch.ssh.relay`` is ``launch``, ``clusterddp.protocol`` is
``protocol``; the package's own ``__init__``, which holds ``__version__``, is ``clusterddp``).
Units sit in layers, top to bottom::

    __main__                                    python -m clusterddp
    cli                                         argparse; wires the commands together
    launch  schedulers  diagnose                the commands; no unit here imports another
    topology  envs  spec  specload  sections  hostfile  registry   the job, its placement, the run registry
    errors exitcodes devices hostlist protocol validate redact affinity templates
    stackreport hang netperf atomicfile clusterddp progress events    leaf modules

    train                                       the torch part, beside the launcher

The rules:

- an import goes to the same unit or down, never up;
- no unit of the command layer imports another one (``launch`` and ``diagnose`` and
  ``schedulers`` are independent: ``cli`` composes them);
- in the two lower layers a unit may build on another of its layer (``spec`` reads
  ``sections``, ``topology`` reads ``envs``), but never in a circle: no two units of a layer
  import each other, directly or through others;
- ``train`` imports only leaf modules, and no unit but ``train`` imports ``train``;
- every unit has a layer: a new top-level module must be placed here first;
- inside a unit too, no module imports another that imports it back, directly or through
  others (``launch.local`` -> ``launch.run`` -> ``launch.local`` was such a circle: the options
  records now sit in the leaf ``launch.options``).

Every import counts, wherever it stands: at module level, inside a function (a lazy import is
still a dependency), and under ``if TYPE_CHECKING:`` (none is exempt: every such import
today already follows the layers, so an exemption would only hide a future cycle). What is
not an import is not checked: a module named in a string for another *process*
(``-m clusterddp.train.bandwidth``, the doctor's worker; the SSH stub becoming ``python -m
clusterddp`` on a remote host through ``runpy``) or a registry entry a package imports
from itself (``schedulers``, ``envs``).

Decisions the layers forced (architecture issue, item 5):

- the head/remote/supervisor/worker protocol is the ``protocol`` leaf, so the supervisor,
  the SSH head, ``clusterddp stacks`` and ``train.liveness`` share it without importing
  each other;
- pure helpers both sides need moved down to leaves: ``stackreport`` (dump parsing,
  grouping, merging across hosts), ``hang`` (who stopped first), ``netperf`` (the doctor's
  arithmetic, shared with its torch worker);
- ``clusterddp doctor`` is a fan-out run with a built-in worker, so it lives in
  ``launch.doctor`` where it may use the SSH fan-out; ``diagnose`` keeps ``clusterddp
  stacks``, which needs only the protocol.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"__main__", "entry"}),
    frozenset({"cli"}),
    frozenset({"launch", "schedulers", "diagnose"}),
    frozenset({"topology", "envs", "spec", "specload", "sections", "hostfile", "registry"}),
    frozenset({"errors", "exitcodes", "devices", "hostlist", "protocol", "validate", "redact", "affinity",
               "templates", "stackreport", "hang", "netperf", "atomicfile", "clusterddp", "pack",
               "progress", "events", "straggler", "procid", "earlystop", "sigstart", "codetree"}),
)
#: The command layer: its units never import each other.
INDEPENDENT = LAYERS[2]
LEAVES = LAYERS[-1]
TRAIN = "train"
ROOT = "clusterddp"


def _sources() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (templates included)."""
    modules: dict[str, Path] = {}
    for base, prefix in ((REPO / "clusterddp", ROOT), (REPO / "templates", f"{ROOT}.templates")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([prefix, *parts])] = path
    return modules


def _unit(module: str, known: set[str]) -> str:
    """The unit a dotted name belongs to (``clusterddp.launch.ssh`` -> ``launch``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT
    return parts[1] if parts[1] in known else ROOT


def _imports(module: str, source: str, is_package: bool) -> list[tuple[str, int]]:
    """Every clusterddp module ``module`` (whose text is ``source``) imports, at any depth."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from clusterddp import validate`` imports the module clusterddp.validate.
            found += [(f"{base}.{alias.name}" if base == ROOT else base, node.lineno) for alias in node.names]
    return sorted({(name, line) for name, line in found if name == ROOT or name.startswith(ROOT + ".")})


def _edges() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, 'file:line imports name') for imports across units."""
    modules = _sources()
    units = {m.split(".")[1] for m in modules if "." in m}
    edges = []
    for module, path in modules.items():
        source = _unit(module, units)
        for name, line in _imports(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"):
            target = _unit(name, units)
            if target != source:
                edges.append((source, target, f"{path.relative_to(REPO)}:{line} imports {name}"))
    return edges


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (as a path that ends where it starts), or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def layer_violations() -> list[str]:
    """Every import against the layers, one line each (empty when the code follows them)."""
    edges = _edges()
    placed = set().union(*LAYERS) | {TRAIN}
    problems = sorted({f"unit {u!r} has no layer: add it to LAYERS in tests/core/test_layers.py"
                       for s, t, _ in edges for u in (s, t) if u not in placed})
    if problems:
        return problems
    same_layer: dict[str, set[str]] = {}
    for source, target, where in edges:
        if source == TRAIN and target not in LEAVES:
            problems.append(f"{where}: train may import only leaf modules, not {target}")
        elif target == TRAIN and source != TRAIN:
            problems.append(f"{where}: nothing in the launcher imports train ({source} does)")
        elif TRAIN in (source, target):
            continue
        elif _layer(target) < _layer(source):
            problems.append(f"{where}: {source} may not import {target}, a layer above it")
        elif _layer(target) == _layer(source):
            if source in INDEPENDENT:
                problems.append(f"{where}: {source} and {target} are commands, they may not import "
                                "each other (cli composes them)")
            else:
                same_layer.setdefault(source, set()).add(target)
    cycle = _cycle(same_layer)
    if cycle:
        proof = [where for s, t, where in edges if (s, t) in set(zip(cycle, cycle[1:]))]
        problems.append(f"units of one layer import each other: {' -> '.join(cycle)} ({'; '.join(proof)})")
    return problems


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name loads: ``clusterddp.launch.start.plan`` for ``from
    clusterddp.launch.start import plan``'s ``clusterddp.launch.start.plan``, the package for a
    name defined in it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _module_imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every clusterddp module ``module`` imports, at any depth;
    ``from pkg import name`` counts as an import of ``pkg.name`` where that is a module."""
    found: list[tuple[str, int]] = []
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _module_of(name, modules) if name.startswith(ROOT) else None
            if target is not None and target != module:
                found.append((target, node.lineno))
    return found


def module_circles() -> list[str]:
    """One circle of module imports (with the file:line of each step), or [] when there is none."""
    modules = _sources()
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for module, path in modules.items():
        for target, line in _module_imports(module, path, modules):
            graph.setdefault(module, set()).add(target)
            where.setdefault((module, target), f"{path.relative_to(REPO)}:{line}")
    cycle = _cycle(graph)
    if not cycle:
        return []
    return [f"{a} -> {b} ({where[(a, b)]})" for a, b in zip(cycle, cycle[1:])]


#: Inside ``launch``: its packages, and the modules at its top, bottom to top. A module imports
#: its own package and the rows below, never up nor across a row (``launch/__init__.py`` draws
#: the same order).
LAUNCH_ORDER: tuple[frozenset[str], ...] = (
    frozenset({"options", "flags"}),
    frozenset({"observe", "teardown"}),
    frozenset({"start"}),
    frozenset({"restart"}),
    frozenset({"supervise"}),
    frozenset({"ssh"}),
    frozenset({"local", "doctor", "remotehead"}),
    frozenset({"run"}),
)
#: The most modules a package of ``launch`` holds: a newcomer reads its map at a glance.
PACKAGE_LIMIT = 12


def _launch_part(module: str) -> str | None:
    """The package (or top module) of ``launch`` a module is in: ``clusterddp.launch.start.warm``
    -> ``start``; None outside launch and for launch's own ``__init__``."""
    parts = module.split(".")
    return parts[2] if parts[:2] == [ROOT, "launch"] and len(parts) > 2 else None


def launch_violations() -> list[str]:
    """Every import inside ``launch`` that runs up or across LAUNCH_ORDER, one line each."""
    rank = {part: i for i, row in enumerate(LAUNCH_ORDER) for part in row}
    modules = _sources()
    problems = sorted({f"launch/{part} has no place: add it to LAUNCH_ORDER in tests/core/test_layers.py"
                       for part in map(_launch_part, modules) if part is not None and part not in rank})
    for module, path in modules.items():
        source = _launch_part(module)
        for target, line in _module_imports(module, path, modules) if source in rank else ():
            part = _launch_part(target)
            if part is not None and part != source and rank.get(part, -1) >= rank[source]:
                problems.append(f"{path.relative_to(REPO)}:{line}: launch.{source} may not import {target}, "
                                "in a package not below its own")
    return problems


def test_launch_packages_import_only_the_ones_below() -> None:
    """launch's packages keep one order (no circle among them, nothing imports up), and the
    drawing in launch/__init__.py is that order."""
    problems = launch_violations()
    assert not problems, "imports against launch's order:\n" + "\n".join(problems)
    text = (REPO / "clusterddp" / "launch" / "__init__.py").read_text()
    drawing = text.split("never up", 1)[1].split("::", 1)[1].split('"""', 1)[0]
    rows = [frozenset(name.rstrip("/").removesuffix(".py") for name in line.split())
            for line in drawing.splitlines() if line.strip()]
    assert rows[::-1] == list(LAUNCH_ORDER), "launch/__init__.py draws another order than LAUNCH_ORDER"


def test_no_launch_package_is_too_big() -> None:
    """Each package of launch holds at most PACKAGE_LIMIT modules."""
    packages = [path.parent for path in (REPO / "clusterddp" / "launch").glob("*/__init__.py")]
    sizes = {p.name: len([m for m in p.glob("*.py") if m.name != "__init__.py"]) for p in packages}
    assert {name: n for name, n in sizes.items() if n > PACKAGE_LIMIT} == {}, sizes


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No circle of modules, lazy and TYPE_CHECKING imports included (docs/architecture.md, "What imports what")."""
    circle = module_circles()
    assert not circle, "modules that import each other, in a circle:\n" + "\n".join(circle)


def test_imports_follow_the_layers() -> None:
    """No import runs up a layer, across the command layer, in a circle, or into train."""
    problems = layer_violations()
    assert not problems, "imports against the layers (docs/architecture.md, 'What imports what'):\n" + "\n".join(problems)


def test_the_checker_sees_every_kind_of_import() -> None:
    """Lazy, relative, TYPE_CHECKING and ``from clusterddp import x`` imports are all found."""
    source = """
import os
from clusterddp import validate, __version__
from . import plan
from ..diagnose import request
if TYPE_CHECKING:
    from clusterddp.spec import JobSpec
def later():
    import clusterddp.train.liveness
"""
    names = [name for name, _ in _imports("clusterddp.launch.local", source, is_package=False)]
    units = {"launch", "diagnose", "spec", "train", "validate"}
    assert sorted(_unit(n, units) for n in names) == sorted([ROOT, "validate", "launch", "diagnose", "spec", "train"])


def test_the_architecture_doc_names_every_unit_of_the_layers() -> None:
    """docs/architecture.md's layer drawing and LAYERS say the same: a unit added to one is
    added to the other, so the design the tests cite stays the code's."""
    text = (REPO / "docs" / "architecture.md").read_text()
    drawing = text.split("## What imports what", 1)[1].split("```")[1]
    named = set(drawing.replace("(", " ").replace(")", " ").split())
    units = set().union(*LAYERS) - {ROOT}
    assert units - named == set(), f"units missing from docs/architecture.md: {sorted(units - named)}"

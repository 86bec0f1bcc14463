"""Only clusterddp.train imports torch (docs/architecture.md): checked on the source of every module."""

from __future__ import annotations

import ast

from tests.conftest import REPO


#: Run by path in a process of its own, the warm interpreter, whose whole point is to import
#: torch (inside a function; the launcher never imports this module: its framing is protocol's).
WARM_INTERPRETER = "clusterddp/launch/start/zygote.py"


def test_no_module_outside_train_imports_torch() -> None:
    """No module outside clusterddp/train (and the warm interpreter) has an import of torch, at any depth."""
    offenders = []
    for path in (REPO / "clusterddp").rglob("*.py"):
        if "train" in path.relative_to(REPO / "clusterddp").parts[:1] or str(path.relative_to(REPO)) == WARM_INTERPRETER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "torch" or n.startswith("torch.") for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders

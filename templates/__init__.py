"""Rendering templates (sbatch, OpenPAI), shipped in the wheel as ``clusterddp.templates``.

setup.cfg maps this directory to the package ``clusterddp.templates``, so the same files
load from a checkout (editable install) and from an installed wheel.
"""

from __future__ import annotations

from importlib import resources


def load_template(name: str) -> str:
    """The text of template ``name`` (e.g. 'slurm.sbatch'); FileNotFoundError names it."""
    path = resources.files(__name__).joinpath(name)
    if not path.is_file():
        raise FileNotFoundError(f"clusterddp template {name!r} is missing from {path}")
    return path.read_text(encoding="utf-8")

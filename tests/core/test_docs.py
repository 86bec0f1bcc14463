"""docs/job-file.md documents every key of the job-file schema."""

from __future__ import annotations

import dataclasses

from clusterddp.spec import JobSpec
from clusterddp.specload import INTERNAL
from tests.conftest import REPO


def _keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(INTERNAL):
            continue
        hint = f.type if not isinstance(f.type, str) else None
        nested = dataclasses.is_dataclass(hint) if hint else None
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            keys.extend(_keys(type(default), f"{prefix}{f.name}."))
        elif not nested:
            keys.append(prefix + f.name)
    return keys


def test_every_job_key_is_documented() -> None:
    """Each key of JobSpec and its sections appears as `key` in docs/job-file.md."""
    text = (REPO / "docs" / "job-file.md").read_text()
    keys = _keys(JobSpec)
    assert len(keys) > 50 and "ssh.port" in keys and "master.addr" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"undocumented job-file keys: {missing}"

"""``clusterddp pack``: the launcher as one file that runs with any python3 (a zipapp).

An image with torch but without clusterddp must run the job (docs/containers.md). The
launcher needs the standard library and PyYAML only, so the zipapp holds clusterddp's own
sources (``clusterddp.train`` included: a worker whose image has torch imports it from the
same file) and PyYAML's pure-Python package, without its C extension: ``yaml`` falls back to
its Python scanner when ``_yaml`` is missing, and a zip cannot load a C extension anyway.
PyYAML is MIT-licensed; its license text travels in the archive (``licenses/PyYAML.txt``).

The archive is reproducible: sorted entries, fixed timestamps, no bytecode. Its
``__main__`` runs the CLI (and puts the archive on PYTHONPATH for the workers), or, with
``protocol.ZIPAPP_BOOTSTRAP_ARG`` first, a worker's bootstrap (clusterddp.launch.start.bootstrap),
or, with ``protocol.ZIPAPP_ZYGOTE_ARG`` first, the warm interpreter
(clusterddp.launch.start.zygote): a python cannot run a file by a path inside a zip, but it
runs the zip, which imports either from itself.
"""

from __future__ import annotations

import functools
import io
import os
import zipfile
from importlib import metadata
from pathlib import Path

import yaml

import clusterddp
import clusterddp.templates
from clusterddp.atomicfile import write_atomically
from clusterddp.errors import ClusterDDPError
from clusterddp.protocol import ZIPAPP_BOOTSTRAP_ARG, ZIPAPP_ZYGOTE_ARG
#: Files of the clusterddp package that go in (sources and the rendering templates).
PACKAGE_SUFFIXES = (".py", ".sbatch", ".yaml")
#: A fixed time for every entry, so the same sources give the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
SHEBANG = b"#!/usr/bin/env python3\n"

MAIN = f'''"""clusterddp {clusterddp.__version__} as one file: python3 clusterddp.pyz run job.yaml"""
import os
import sys

archive = os.path.abspath(sys.argv[0])
if sys.argv[1:2] == [{ZIPAPP_BOOTSTRAP_ARG!r}]:
    del sys.argv[1]
    from clusterddp.launch.start import bootstrap
    bootstrap.main()
elif sys.argv[1:2] == [{ZIPAPP_ZYGOTE_ARG!r}]:
    del sys.argv[1]
    from clusterddp.launch.start import zygote
    zygote.main()
else:
    # Workers (run by the bootstrap, which replaces sys.path[0]) import clusterddp.train from here.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != archive]
    os.environ["PYTHONPATH"] = os.pathsep.join([archive, *paths])
    from clusterddp.cli import main
    sys.exit(main())
'''


def package_files() -> list[tuple[str, Path]]:
    """(name in the archive, file here) for clusterddp and PyYAML's pure-Python part."""
    entries: list[tuple[str, Path]] = []
    # The templates are a package of their own in a checkout (templates/, mapped by setup.cfg's
    # package_dir) and inside clusterddp/ once installed: take them from wherever they import.
    templates = Path(clusterddp.templates.__file__).parent
    sources = [("clusterddp", Path(clusterddp.__file__).parent), ("yaml", Path(yaml.__file__).parent)]
    if templates.parent != sources[0][1]:
        sources.insert(1, ("clusterddp/templates", templates))
    for name, root in sources:
        suffixes = PACKAGE_SUFFIXES if name.startswith("clusterddp") else (".py",)
        for directory, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(files):
                path = Path(directory) / file
                if path.suffix in suffixes:
                    entries.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    return entries


def yaml_license() -> bytes | None:
    """PyYAML's LICENSE from its installed metadata (MIT: the notice must travel with it)."""
    try:
        dist = metadata.distribution("PyYAML")
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name.upper().startswith(("LICENSE", "COPYING")):
            return Path(str(dist.locate_file(file))).read_bytes()
    return None


@functools.lru_cache(maxsize=1)
def archive_bytes() -> bytes:
    """The zipapp's bytes: the same sources give the same bytes (a rendered Kubernetes
    ConfigMap holds them, and renders are compared byte for byte). Cached: one per process."""
    buffer = io.BytesIO()
    buffer.write(SHEBANG)  # before the zip, as zipapp writes it: the offsets then count it
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
        add("__main__.py", MAIN.encode("utf-8"))
        names = []
        for name, path in package_files():
            add(name, path.read_bytes())
            names.append(name)
        license_text = yaml_license()
        if license_text is not None:
            add("licenses/PyYAML.txt", license_text)
    data = buffer.getvalue()
    if "clusterddp/cli.py" not in names:
        raise ClusterDDPError("cannot pack the launcher: clusterddp's sources are not files here "
                              f"({Path(clusterddp.__file__).parent}); run clusterddp from a checkout or an install")
    return data


def build(output: str) -> int:
    """Write the zipapp to ``output`` (atomically, executable); its size in bytes."""
    data = archive_bytes()
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(output, data, mode=0o755)
    return len(data)


def default_output() -> str:
    return f"clusterddp-{clusterddp.__version__}.pyz"

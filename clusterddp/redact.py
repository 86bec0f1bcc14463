"""Secrets: where they enter the launcher, and the one path that keeps them out of its output.

Two kinds of secret enter: the OpenPAI bearer token (``--token-file`` or
``CLUSTERDDP_OPENPAI_TOKEN``) and the values of the job's ``env_passthrough`` variables
(WANDB_API_KEY, HF_TOKEN ...), which travel by name from the launcher's environment. Both are
``register``-ed as they are read. Dry runs and rendered files never hold a passthrough value in
the first place: they name the variable instead.

Everything clusterddp prints passes through ``mask`` (bytes) or ``scrub`` (text, the same
matching): the CLI's error line, the REST client's errors, sbatch's stderr, and the consoles,
which are where a worker's own words come out: a node's ``ConsoleSink`` (every relayed worker
line, the failure report with its last lines, warnings, stacks) and the SSH head's ``Console``
(every line relayed from a host, the head's report with the root cause's last lines). Where a
line is cut short (the console's 64 KiB cut, the report's 2000-character last lines), the
piece is masked with ``cut=True``: a secret that the cut splits is masked by its start.

What is matched: each registered value whole, its escaped forms (repr, ``unicode_escape``,
JSON), and each of its lines, always within one line of output as the worker wrote it (a
line written in several writes is one line: the readers join it before it is shown). Not
matched: values shorter than ``MIN_SECRET_CHARS``, a value a worker prints in pieces on
separate lines or transformed (base64, reversed ...). Log files keep the raw bytes.
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Mapping

from clusterddp.errors import JobSpecError
from clusterddp.validate import env_name_problem

#: What a secret is replaced with in any printed text.
MASK = "***"
_MASK_BYTES = MASK.encode()
#: Values shorter than this are not scrubbed: masking every "1" or "on" in every message would
#: garble the output and hide nothing worth hiding.
MIN_SECRET_CHARS = 4

#: Every form of every secret, as the bytes a stream would hold, longest first (so a secret
#: that contains another is masked whole). Replaced whole, never mutated: reader threads use it.
_forms: tuple[bytes, ...] = ()


def _bytes(text: str) -> bytes:
    """``text`` as the bytes it came from: os.environ holds undecodable bytes as surrogates."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def register(value: str) -> None:
    """Remember ``value`` (and the escaped forms a repr, a JSON dump or a traceback would show,
    and each of its lines) as secret."""
    global _forms
    if len(value) < MIN_SECRET_CHARS:
        return
    forms = {value, repr(value)[1:-1], value.encode("unicode_escape").decode("ascii"),
             json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms.update(value.splitlines())
    # A blank line of a multi-line value would mask every indentation: only forms that
    # hold MIN_SECRET_CHARS visible characters count.
    new = {_bytes(form) for form in forms if len(form.strip()) >= MIN_SECRET_CHARS}
    _forms = tuple(sorted(new.union(_forms), key=len, reverse=True))


def mask(data: bytes, cut: bool = False) -> bytes:
    """``data`` with every registered secret replaced by ``***``.

    ``cut``: ``data`` is the start of a longer line whose rest is not shown; a secret that
    begins in ``data`` and goes on past its end is masked by its start too (even one character
    of it: the cut falls anywhere)."""
    forms = _forms
    for form in forms:
        if form in data:
            data = data.replace(form, _MASK_BYTES)
    if cut and forms:
        longest = max(_trailing_start(data, form) for form in forms)
        if longest:
            data = data[:-longest] + _MASK_BYTES
    return data


def _trailing_start(data: bytes, form: bytes) -> int:
    """The largest n < len(form) such that ``data`` ends with the first n bytes of ``form``."""
    for n in range(min(len(form) - 1, len(data)), 0, -1):
        if data[-1] == form[n - 1] and data.endswith(form[:n]):
            return n
    return 0


def scrub(text: str, cut: bool = False) -> str:
    """``mask`` for text (messages built from outside text, report lines)."""
    if not _forms:
        return text
    return mask(_bytes(text), cut).decode("utf-8", "surrogateescape")


def passthrough_env(names: Iterable[str], environ: Mapping[str, str], where: str = "<job>",
                    job_env: Mapping[str, str] | None = None,
                    line_of: Callable[[str], int | None] = lambda key: None) -> dict[str, str]:
    """The values of the ``env_passthrough`` variables, registered as secrets.

    ``line_of(key)`` is the job file's line of a key (``JobSpec.line_of``), for the errors.

    A name that is unset here is an error before anything starts (a worker without its API key
    fails much later, on every node). A name that the job's ``env:`` also sets is refused: the
    value would then be written in the job file after all, and which one wins would be a guess.
    """
    values: dict[str, str] = {}
    for index, name in enumerate(names):
        key = f"env_passthrough[{index}]"
        problem = env_name_problem(name)
        if problem:
            raise JobSpecError(where, line_of(key), key, problem)
        if job_env is not None and name in job_env:
            raise JobSpecError(where, line_of(key), key, f"{name} is also set in env:",
                               "keep a secret in env_passthrough only, and its value out of the job file")
        if name not in environ:
            raise JobSpecError(where, line_of(key), key, f"{name} is not set in the launcher's environment",
                               f"export {name} before starting clusterddp, or remove it from env_passthrough")
        values[name] = environ[name]
        register(environ[name])
    return values


def register_present(names: Iterable[str], environ: Mapping[str, str]) -> None:
    """Register the values of those ``env_passthrough`` names that ``environ`` holds. Where the
    pods take the values from elsewhere (a Kubernetes Secret), one unset here is no error; one
    set here is still the secret, and the platform's CLI may echo it."""
    for name in names:
        value = environ.get(name)
        if isinstance(value, str):
            register(value)

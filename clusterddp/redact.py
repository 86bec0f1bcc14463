"""Secrets: where they enter the launcher, and the one path that keeps them out of its output.

Two kinds of secret enter: the OpenPAI bearer token (``--token-file`` or
``CLUSTERDDP_OPENPAI_TOKEN``) and the values of the job's ``env_passthrough`` variables
(WANDB_API_KEY, HF_TOKEN ...), which travel by name from the launcher's environment. Both are
``register``-ed as they are read; everything that prints a message built from outside text (the
CLI's error line, the REST client's errors, sbatch's stderr) passes it through ``scrub``. Dry
runs and rendered files never hold a passthrough value in the first place: they name the
variable instead.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from clusterddp.errors import JobSpecError
from clusterddp.validate import env_name_problem

#: What a secret is replaced with in any printed text.
MASK = "***"
#: Values shorter than this are not scrubbed: masking every "1" or "on" in every message would
#: garble the output and hide nothing worth hiding.
MIN_SECRET_CHARS = 4

_secrets: set[str] = set()


def register(value: str) -> None:
    """Remember ``value`` (and the escaped forms a repr or a traceback would show) as secret."""
    if len(value) < MIN_SECRET_CHARS:
        return
    forms = {value, repr(value)[1:-1], value.encode("unicode_escape").decode("ascii")}
    forms.update(line for line in value.splitlines() if len(line) >= MIN_SECRET_CHARS)
    _secrets.update(form for form in forms if len(form) >= MIN_SECRET_CHARS)


def scrub(text: str) -> str:
    """``text`` with every registered secret replaced by ``***`` (longest first, so a secret
    that contains another is masked whole)."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


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

"""One small error hierarchy: every error the user can fix carries where it came from.

The CLI turns any ``ClusterDDPError`` into one line on stderr and its ``exit_code``;
nothing below the CLI prints or exits.
"""

from __future__ import annotations

from typing import Sequence


class ClusterDDPError(Exception):
    """Base of all errors the CLI reports as one line, without a traceback."""

    exit_code: int = 2

    def __init__(self, message: str, hint: str | None = None, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: One line per host or item of an aggregate error (a fan-out's preflight): the CLI
        #: prints each on its own indented line, control characters escaped.
        self.details = tuple(details)

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message


class JobSpecError(ClusterDDPError):
    """A job file that cannot be used: names the file, the line and the key path."""

    def __init__(self, path: str, line: int | None, key: str, message: str, hint: str | None = None) -> None:
        where = f"{path}:{line}" if line else path
        prefix = f"{where}: {key}: " if key else f"{where}: "
        super().__init__(prefix + message, hint)
        self.path = path
        self.line = line
        self.key = key
        self.problem = message

    def at_line(self, line: int | None) -> "JobSpecError":
        """The same error at ``line``: checks that run after loading (renderers, the
        environment) know the key; the job, which remembers every key's line, adds it."""
        return JobSpecError(self.path, line, self.key, self.problem, self.hint)


class EnvironmentDetectionError(ClusterDDPError):
    """The cluster environment is recognised but its variables are incomplete or wrong."""


class HostlistError(ClusterDDPError):
    """A malformed SLURM hostlist or hostfile."""


class LaunchError(ClusterDDPError):
    """Workers could not be started (bad interpreter, missing script, port in use...)."""


class RemoteError(ClusterDDPError):
    """One or more remote hosts failed a check or could not be reached."""


class SubmitError(ClusterDDPError):
    """A scheduler refused or could not be reached while submitting."""

    exit_code = 1

"""What a human sees: a progress bar and TensorBoard scalars, from rank 0 only.

With N ranks each drawing its own bar the console is unreadable and N event files make
TensorBoard plot N copies of the same curve; the other ranks get silent stand-ins with the
same methods, so calling code has no rank checks.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, Mapping

from clusterddp.train.dist import DistContext


class _Silent:
    """Stand-in for a tqdm bar on ranks other than 0."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self._iterable)

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def progress(iterable: Iterable[Any], ctx: DistContext, *, desc: str = "",
             total: int | None = None, enabled: bool | None = None) -> Any:
    """A tqdm bar on rank 0 (on stderr), a silent pass-through elsewhere or when disabled.

    ``enabled=None`` means "when stderr is a terminal": in a log file (the launcher's, a
    SLURM output file) a bar is a stream of carriage returns, and the per-epoch summary
    line says the same.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not (enabled and ctx.is_main):
        return _Silent(iterable)
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, dynamic_ncols=True,
                leave=False)


class ScalarLogger:
    """TensorBoard scalars written by rank 0; without a directory, or elsewhere, a no-op."""

    def __init__(self, log_dir: str | None, ctx: DistContext) -> None:
        self._writer = None
        if log_dir and ctx.is_main:
            # Imported here: tensorboard is optional and slow to import.
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=log_dir)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Add each ``name: value`` at ``step`` and flush, so a kill loses nothing logged."""
        if self._writer is None:
            return
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

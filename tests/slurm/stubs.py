"""A stub srun's stand-in for the launchers, for tests that run a rendered sbatch script with
stub SLURM commands: what each node's real launcher leaves in ``--marks-dir`` (names from
clusterddp.protocol), so the script's verdict sees launchers that started and ended."""

from __future__ import annotations

from clusterddp import protocol


def launcher_records(code: str = "0", nodes: str = "$n") -> str:
    """POSIX sh lines for a stub srun: read ``--nodes=N`` and ``--marks-dir DIR`` from its
    arguments, then write node<i>.started and node<i>.exit (``code``) for ``nodes`` nodes
    (default: all N; "1": only node 0, as when a launch failed on the others)."""
    started = protocol.mark_name("$i", protocol.MARK_STARTED)
    ended = protocol.mark_name("$i", protocol.MARK_EXIT)
    return ('n=1; dir=; prev=\n'
            'for a in "$@"; do\n'
            '    case "$a" in --nodes=*) n=${a#--nodes=} ;; esac\n'
            '    [ "$prev" = --marks-dir ] && dir=$a\n'
            '    prev=$a\n'
            'done\n'
            f'i=0; while [ -n "$dir" ] && [ "$i" -lt "{nodes}" ]; do\n'
            f'    echo "pid $$ on stub" > "$dir/{started}"\n'
            f'    [ -z "{code}" ] || echo "{code}" > "$dir/{ended}"\n'
            '    i=$((i + 1))\n'
            'done\n')

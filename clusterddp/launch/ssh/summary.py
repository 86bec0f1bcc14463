"""The head's closing report: which host failed first, and what became of every host."""

from __future__ import annotations

from clusterddp.exitcodes import HANG
from clusterddp.launch.logs import visible_text
from clusterddp.launch.ssh.io import RemoteLauncher
from clusterddp.launch.ssh.relay import Outcome


def format_outcome(job_name: str, outcome: Outcome) -> str:
    """Root cause first (host, node rank, rank, exit, log, last lines), then one line per host."""
    root = outcome.root
    lines: list[str] = []
    if root is not None:
        lines.append(f"clusterddp: job '{job_name}' failed on {root.name}: {host_failure(root)}")
        lines.append("  root cause (first failure across hosts):")
        lines.append(f"    host:       {root.name} ({root.session.host.address}), node rank {root.plan.node_rank}")
        cause = (root.result or {}).get("root_cause")
        if cause:
            exit_text = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exit_code')}"
            lines.append(f"    rank:       {cause.get('rank')} (local rank {cause.get('local_rank')}), "
                         f"pid {cause.get('pid')}")
            lines.append(f"    exit:       {exit_text}")
            lines.append(f"    log:        {cause.get('log')} (on {root.name})")
            if cause.get("tail"):
                lines.append("    last lines:")
                # A worker's own words, as the host's report shows them (the head's Console masks).
                lines.extend(f"      {visible_text(str(line))}" for line in cause["tail"])
        if outcome.exit_code == HANG and outcome.stop_reason:
            lines.append(f"    verdict:    {outcome.stop_reason}")
    elif outcome.exit_code != 0:
        lines.append(f"clusterddp: job '{job_name}' stopped: {outcome.stop_reason or 'a host failed'}")
    else:
        return ""
    lines.append("  hosts:")
    for launcher in outcome.launchers:
        lines.append(f"    {launcher.name:<16} node {launcher.plan.node_rank:<3} {_state(launcher)}")
    return "\n".join(lines)


def host_failure(launcher: RemoteLauncher) -> str:
    """Why a host counts as failed: its lost link, its first rank's exit, or its launcher's."""
    if launcher.lost:
        return launcher.lost
    cause = (launcher.result or {}).get("root_cause")
    if cause:
        outcome = f"killed by {cause['signal']}" if cause.get("signal") else f"exit code {cause.get('exit_code')}"
        return f"rank {cause.get('rank')} {outcome}"
    reason = (launcher.result or {}).get("reason")
    if launcher.exit_code is None:
        return reason or "still stopping"
    if launcher.result is None and launcher.exit_status == -1:
        return "the launcher died without an exit status (killed by a signal?), its host still answering"
    return f"launcher exit code {launcher.exit_code}" + (f" ({reason})" if reason else "")


def _state(launcher: RemoteLauncher) -> str:
    if launcher.lost:
        return launcher.lost
    if not launcher.done:
        return "did not report back (stopped by process-group kill or unreachable)"
    code = launcher.exit_code
    if code == 0:
        return "finished (exit 0)"
    cause = (launcher.result or {}).get("root_cause")
    if launcher.eof_sent and not (cause and not cause.get("stopped_by_us")):
        return f"stopped by clusterddp (exit {code})"
    return f"failed: {host_failure(launcher)}"

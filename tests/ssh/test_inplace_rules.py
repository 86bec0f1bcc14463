"""When the head restarts in place, and on which launchers (launch/ssh/inplace.py ``keepable``):
the rules over what the relay left in each launcher, without a host (the test bed runs the
paths themselves: tests/ssh/test_inplace.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from clusterddp.launch.ssh.inplace import keepable


class _Channel:
    def __init__(self, up: bool) -> None:
        self.up = up

    def exit_status_ready(self) -> bool:
        return not self.up

    def get_transport(self) -> Any:
        return SimpleNamespace(is_active=lambda: self.up)


def _launcher(name: str, state: str, address: str = "10.0.0.1", route_src: str | None = None) -> Any:
    """``waits``: reported and waits, session up; ``lost``: its link gone; ``ended``: its
    launcher ended on its own (the link fine). ``route_src``: the address its route to the
    master left from (the probe's fact), by default its own."""
    session = SimpleNamespace(host=SimpleNamespace(address=address, port=22),
                              facts={"route": {"dev": "eth0", "src": route_src or address}})
    return SimpleNamespace(name=name, waits=state == "waits", stdin_closed=False, over=state != "waits",
                           channel=_Channel(state == "waits"), session=session,
                           lost="connection lost (no TCP acknowledgement for 1s)" if state == "lost" else None)


def _launch(listed: int, nodes: tuple[int, int] | None, master_addr: str | None = None) -> Any:
    low, high = nodes or (listed, listed)
    return SimpleNamespace(job=SimpleNamespace(elastic=nodes is not None), low=low, high=high,
                           hosts=[SimpleNamespace(name=f"h{i}") for i in range(listed)], master_addr=master_addr)


@pytest.mark.parametrize("listed, nodes, master, states, kept", [
    (2, None, None, "waits waits", "h0 h1"),              # every host waits: all of them
    (3, (2, 3), None, "waits waits waits", "h0 h1 h2"),   # elastic at MAX: all of them
    (4, (2, 3), None, "waits waits waits", "h0 h1 h2"),   # at MAX, a spare listed: none needed
    (4, (2, 4), None, "waits waits waits", None),         # below MAX, a spare listed: probe anew
    (4, (2, 4), None, "waits waits lost", None),          # lost, and a host not in this attempt
    (3, (2, 3), None, "waits waits lost", "h0 h1"),       # lost, no other host: those left
    (4, (3, 4), None, "waits lost waits waits", "h0 h2 h3"),
    (3, (3, 3), None, "waits waits lost", None),          # fewer than MIN
    (3, (2, 3), None, "waits waits ended", None),         # a launcher gone, its host fine: launch anew
    (2, None, None, "waits lost", None),                  # a fixed node count
    (3, (2, 3), None, "lost waits waits", "h1 h2"),       # node 0 lost: the master moves to h1
    (3, (2, 3), "10.0.0.9", "lost waits waits", "h1 h2"),  # the user's master stays
    (3, (1, 3), None, "waits lost lost", "h0"),
    (3, (1, 3), None, "lost lost lost", None),
])
def test_which_launchers_a_restart_keeps(listed: int, nodes: tuple[int, int] | None, master: str | None,
                                         states: str, kept: str | None) -> None:
    launchers = [_launcher(f"h{i}", state) for i, state in enumerate(states.split())]
    running = keepable(_launch(listed, nodes, master), launchers)
    assert (None if running is None else " ".join(lau.name for lau in running)) == kept


def test_node_0_lost_keeps_the_launchers_only_when_the_next_master_is_on_the_jobs_network() -> None:
    """The next node 0's address (as the head resolves it) must be the one its own route to the old
    master left from: then every host's interface already reaches it. A host known to the head by
    another address (a management network) leaves only a probe to tell: launch anew."""
    launch = _launch(3, (2, 3))
    same = [_launcher("h0", "lost", "10.0.0.1"), _launcher("h1", "waits", "10.0.0.2"),
            _launcher("h2", "waits", "10.0.0.3")]
    assert [lau.name for lau in keepable(launch, same) or []] == ["h1", "h2"]
    other = [_launcher("h0", "lost", "10.0.0.1"), _launcher("h1", "waits", "192.168.7.2", route_src="10.0.0.2"),
             _launcher("h2", "waits", "10.0.0.3")]
    assert keepable(launch, other) is None
    unrouted = [_launcher("h0", "lost"), _launcher("h1", "waits", "10.0.0.2"), _launcher("h2", "waits", "10.0.0.3")]
    unrouted[1].session.facts = {}
    assert keepable(launch, unrouted) is None

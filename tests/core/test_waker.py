"""The supervisor's wake-up call works from signal handlers, where threading.Event can deadlock."""

from __future__ import annotations

import os
import signal
import threading
import time

from clusterddp.launch.supervise.waker import Waker


def test_set_before_wait_wakes_at_once_and_clear_resets() -> None:
    """A set before the wait is not lost; after clear, a wait times out."""
    waker = Waker()
    waker.set()
    waker.set()
    assert waker.wait(0)  # no wait at all: the set is already there
    waker.clear()
    assert not waker.wait(0.05)


def test_set_from_a_thread_wakes_the_waiter() -> None:
    """Another thread's set ends a long wait early."""
    waker = Waker()
    threading.Timer(0.05, waker.set).start()
    assert waker.wait(600.0)  # returns at the set (a wait to the end would hang the test, not pass it)


def test_signal_handler_storm_never_deadlocks() -> None:
    """SIGCHLD-like signals setting the waker while the loop waits and clears: the loop keeps turning.

    With threading.Event this pattern can hang forever when the handler runs while the main
    thread holds the Event's lock; the pipe-based waker takes no lock."""
    waker = Waker()
    previous = signal.signal(signal.SIGUSR2, lambda *_: waker.set())
    stop = threading.Event()

    def storm() -> None:
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.0005)

    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 600  # a deadlock stops the turns; a loaded machine only slows them
        turns = 0
        while turns < 200 and time.monotonic() < deadline:
            waker.wait(0.001)
            waker.clear()
            turns += 1
    finally:
        stop.set()
        thread.join(2.0)
        signal.signal(signal.SIGUSR2, previous)
    assert turns == 200


def test_full_pipe_never_blocks_a_setter() -> None:
    """Thousands of sets without a clear (a pipe's buffer fills) never block the caller."""
    waker = Waker()
    for _ in range(200_000):  # a blocking write would hang here, not slow down
        waker.set()
    assert waker.wait(0)

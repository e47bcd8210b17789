"""Waiting on something outside the test (a process, a thread) with a bound on how long."""

import time


def until(predicate, timeout: float = 30.0):
    """``predicate()``'s first true value, polled every 50 ms for at most ``timeout`` seconds;
    its last value when the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()

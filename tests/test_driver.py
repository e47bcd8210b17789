"""The dashboard's terminal driver: its input thread sleeps until a key, an escape timeout or the exit."""

import asyncio
import os
import selectors
import signal
import threading
import time

from textual import events

from traintop.app.driver import QuietLinuxDriver, quiet_driver_class


def _until(cond, timeout=3.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_the_input_thread_sleeps_until_a_key_an_escape_timeout_or_the_exit(monkeypatch):
    waits = []
    select = selectors.SelectSelector.select

    def counting(self, timeout=None):
        waits.append(timeout)
        return select(self, timeout)

    monkeypatch.setattr(selectors.SelectSelector, "select", counting)
    keys = []

    class Driver(QuietLinuxDriver):
        def process_message(self, message):
            if isinstance(message, events.Key):
                keys.append(message.key)

    handlers = signal.getsignal(signal.SIGTSTP), signal.getsignal(signal.SIGCONT)

    async def go():
        r, w = os.pipe()
        driver = Driver(None)
        driver.fileno = r
        thread = threading.Thread(target=driver.run_input_thread)
        thread.start()
        try:
            time.sleep(1.0)
            idle = len(waits)  # Textual's own thread would have woken ~10 times by now
            os.write(w, b"a")
            assert _until(lambda: keys == ["a"])
            os.write(w, b"\x1b")  # a lone Esc is a key only once the parser's timeout passes
            assert _until(lambda: keys == ["a", "escape"])
            assert any(t is not None and t > 0 for t in waits)  # it waited for that timeout, not forever
            driver.exit_event.set()
            thread.join(timeout=2.0)
            assert not thread.is_alive()
            return idle
        finally:
            driver.exit_event.set()
            driver.close()
            os.close(r)
            os.close(w)

    try:
        idle = asyncio.run(go())
    finally:
        signal.signal(signal.SIGTSTP, handlers[0])
        signal.signal(signal.SIGCONT, handlers[1])
    assert idle <= 2 and waits[0] is None


def test_only_textuals_linux_driver_is_replaced():
    from textual.drivers.headless_driver import HeadlessDriver
    from textual.drivers.linux_driver import LinuxDriver

    assert quiet_driver_class(LinuxDriver) is QuietLinuxDriver
    assert quiet_driver_class(HeadlessDriver) is HeadlessDriver

"""Textual's Linux driver with an input thread that sleeps until there is something to do.

Textual's input thread waits on the terminal with a 0.1 s timeout so that it notices when to
stop: 10 wake-ups a second, about 0.7 ms of CPU a second on an H200's host (8 % of the whole
dashboard at 1 Hz). Here it waits until input arrives, until the parser's escape timeout is due
(a lone Esc becomes a key after it), or until the driver stops: setting the exit event also
writes to a pipe the thread waits on. Should Textual's parser not expose its timeout, the
thread waits 0.1 s at a time, as Textual's does.
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder

from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

POLL_S = 0.1  # Textual's own wait, used only where the parser's timeout cannot be read


class _WakingEvent(threading.Event):
    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self._wake_fd = wake_fd

    def set(self) -> None:
        super().set()
        if self._wake_fd < 0:  # the driver is closed: its pipe's number may belong to another file now
            return
        try:
            os.write(self._wake_fd, b"x")
        except OSError:  # the pipe is full: the thread is woken already
            pass


class QuietLinuxDriver(LinuxDriver):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.exit_event = _WakingEvent(self._wake_w)

    def run_input_thread(self) -> None:
        fileno, wake = self.fileno, self._wake_r
        selector = selectors.SelectSelector()
        selector.register(fileno, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode

        knows_timeout = hasattr(parser, "_timeout_time")

        def wait_s() -> float | None:
            if not knows_timeout:
                return POLL_S
            due = parser._timeout_time
            if due is None:
                return None  # nothing pending: sleep until a key or the exit event
            return max(0.0, due - get_time())

        def dispatch(ready, final: bool = False) -> None:
            for n, (key, mask) in enumerate(ready):
                if key.fd == wake:
                    os.read(wake, 64)
                    continue
                if mask & selectors.EVENT_READ:
                    data = decode(os.read(fileno, 1024 * 4), final=final and n == len(ready) - 1)
                    if not data:  # stdin is a pipe that ended
                        break
                    for event in parser.feed(data):
                        self.process_message(event)
            for event in parser.tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                dispatch(selector.select(wait_s()))
            selector.unregister(fileno)
            dispatch(selector.select(POLL_S), final=True)
        finally:
            selector.close()

    def close(self) -> None:
        super().close()
        self.exit_event._wake_fd = -1
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def quiet_driver_class(chosen):
    """Textual's choice of driver, with the quiet one in place of its Linux driver (a driver
    named through TEXTUAL_DRIVER, or another platform's, is left as it is)."""
    if chosen is LinuxDriver:
        return QuietLinuxDriver
    return chosen

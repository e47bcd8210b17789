"""Drive the real ``traintop`` in a real terminal: a pty, read back through a terminal emulator.

The program runs as a user runs it (``python -m traintop ...`` from this environment) on a
pseudo-terminal of a given size; what it writes is kept as raw bytes (to check that no
control sequence from outside leaks) and fed to ``pyte``, which keeps the screen as text.
Keys are the bytes a terminal sends; a resize sets the pty's window size, and the kernel
sends SIGWINCH to the program (the pty is its controlling terminal).

Every wait polls the screen against a generous deadline: the machine may be busy, and a
fixed sleep is never an assertion.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pyte

KEYS = {
    "up": "\x1b[A", "down": "\x1b[B", "right": "\x1b[C", "left": "\x1b[D",
    "home": "\x1b[H", "end": "\x1b[F", "pageup": "\x1b[5~", "pagedown": "\x1b[6~",
    "insert": "\x1b[2~", "delete": "\x1b[3~", "tab": "\t", "shift+tab": "\x1b[Z",
    "escape": "\x1b", "enter": "\r", "space": " ", "backspace": "\x7f",
    "f1": "\x1bOP", "f2": "\x1bOQ", "f3": "\x1bOR", "f4": "\x1bOS", "f5": "\x1b[15~",
    "f10": "\x1b[21~", "f12": "\x1b[24~",
    "shift+up": "\x1b[1;2A", "shift+down": "\x1b[1;2B", "ctrl+left": "\x1b[1;5D", "ctrl+right": "\x1b[1;5C",
    "ctrl+up": "\x1b[1;5A", "ctrl+down": "\x1b[1;5B", "ctrl+home": "\x1b[1;5H", "ctrl+end": "\x1b[1;5F",
    "ctrl+pageup": "\x1b[5;5~", "ctrl+pagedown": "\x1b[6;5~", "shift+home": "\x1b[1;2H", "shift+end": "\x1b[1;2F",
}
for _c in "abcdefghijklmnopqrstuvwxyz":
    KEYS[f"ctrl+{_c}"] = chr(ord(_c) - 96)

# Markers of a Python traceback, on screen or anywhere in what the program wrote.
TRACEBACK_MARKERS = (b"Traceback (most recent call last)", b"Error: ", b"Exception: ")
TIMEOUT = float(os.environ.get("TRAINTOP_TERM_TIMEOUT", "90"))


class TerminalError(AssertionError):
    pass


class Terminal:
    """One run of ``traintop ARGS`` on a ``cols`` × ``rows`` pty."""

    def __init__(self, args: list[str], cols: int = 80, rows: int = 24, *, home: str,
                 env: dict | None = None, cwd: str | None = None) -> None:
        self.args = list(args)
        self.cols, self.rows = cols, rows
        self.raw = bytearray()
        self._lock = threading.Lock()
        self._screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        master, slave = os.openpty()
        self._master = master
        self._set_winsize(cols, rows)
        e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX", "TEXTUAL")}
        e.update(TERM="xterm-256color", COLORTERM="truecolor", HOME=home,
                 XDG_DATA_HOME=os.path.join(home, "data"), XDG_CONFIG_HOME=os.path.join(home, "config"),
                 XDG_RUNTIME_DIR=os.path.join(home, "run"), PYTHONFAULTHANDLER="1")
        os.makedirs(e["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
        e.update(env or {})

        def become_controlled():  # the pty is the child's controlling terminal: SIGWINCH on resize
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traintop", *self.args], stdin=slave, stdout=slave, stderr=slave,
            env=e, cwd=cwd, start_new_session=True, preexec_fn=become_controlled, close_fds=True)
        os.close(slave)
        os.set_blocking(master, False)  # a program that stops reading must not hang the test
        self._scanned = 0  # raw bytes already searched for a traceback
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # -- plumbing ---------------------------------------------------------------------
    def _set_winsize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._master], [], [], 0.2)
                if not ready:
                    if self._closed:
                        return
                    continue
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every writer has closed the pty
                return
            if not data:
                return
            with self._lock:
                self.raw += data
                self._stream.feed(data)

    def write(self, data: bytes, timeout: float = TIMEOUT) -> None:
        """Type ``data``; fails if the program stops reading its input for ``timeout``."""
        deadline = time.monotonic() + timeout
        while data:
            _, ready, _ = select.select([], [self._master], [], 0.2)
            if ready:
                try:
                    data = data[os.write(self._master, data):]
                except BlockingIOError:
                    pass
                continue
            self.check()
            if time.monotonic() > deadline:
                raise TerminalError(f"traintop stopped reading its input for {timeout:.0f} s; "
                                    f"screen:\n{self.text()}")

    # -- what the test does -----------------------------------------------------------
    def press(self, *keys: str, gap: float = 0.0) -> None:
        """Send keys by name (``KEYS``) or as literal characters."""
        for k in keys:
            self.write(KEYS.get(k, k).encode())
            if gap:
                time.sleep(gap)

    def click(self, x: int, y: int, button: int = 0) -> None:
        """A mouse click at column ``x``, row ``y`` (0-based), as SGR mouse reports."""
        self.write(f"\x1b[<{button};{x + 1};{y + 1}M\x1b[<{button};{x + 1};{y + 1}m".encode())

    def scroll(self, x: int, y: int, down: bool = True) -> None:
        self.write(f"\x1b[<{65 if down else 64};{x + 1};{y + 1}M".encode())

    def resize(self, cols: int, rows: int) -> None:
        with self._lock:
            self.cols, self.rows = cols, rows
            self._screen.resize(rows, cols)
            self._set_winsize(cols, rows)
        # Where the pty is the controlling terminal the kernel signals its foreground
        # group; say it again in case it is not (a second resize event is harmless).
        try:
            os.killpg(self.proc.pid, signal.SIGWINCH)
        except OSError:
            pass

    def nudge(self) -> None:
        """One more SIGWINCH at the same size. Textual can miss the last of several quick
        resizes (it keeps drawing at an earlier size until the next signal; a bare Textual
        app does the same); a later signal makes it read the size again."""
        try:
            os.killpg(self.proc.pid, signal.SIGWINCH)
        except OSError:
            pass

    def text(self) -> str:
        with self._lock:
            return "\n".join(line.rstrip() for line in self._screen.display)

    def raw_bytes(self) -> bytes:
        with self._lock:
            return bytes(self.raw)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def traceback(self) -> str | None:
        """The program's traceback (or error report) if it printed one, else None."""
        start = max(0, self._scanned - 64)  # only what came since the last look (and an overlap)
        with self._lock:
            new, end = bytes(self.raw[start:]), len(self.raw)
        for marker in TRACEBACK_MARKERS:
            k = new.find(marker)
            if k >= 0:
                with self._lock:
                    k += start
                    return bytes(self.raw[max(0, k - 2000): k + 6000]).decode("utf-8", "replace")
        self._scanned = end
        return None

    def check(self) -> None:
        """Fail with what the program showed if it died or printed a traceback."""
        tb = self.traceback()
        if tb is not None:
            raise TerminalError(f"traintop {' '.join(self.args)} printed an error:\n{tb}")
        if not self.alive():
            raise TerminalError(f"traintop {' '.join(self.args)} exited with {self.proc.returncode}; "
                                f"screen:\n{self.text()}\noutput tail:\n{self.raw_bytes()[-3000:]!r}")

    def wait_for(self, condition, what: str, timeout: float = TIMEOUT, check: bool = True,
                 nudge_every: float | None = None) -> str:
        """Poll until ``condition(screen_text)`` holds; return the screen text. With
        ``nudge_every``, send a SIGWINCH that often (see ``nudge``) while waiting."""
        deadline = time.monotonic() + timeout
        next_nudge = time.monotonic() + nudge_every if nudge_every else None
        while True:
            if next_nudge is not None and time.monotonic() > next_nudge:
                self.nudge()
                next_nudge = time.monotonic() + nudge_every
            screen = self.text()
            if condition(screen):
                return screen
            if check:
                self.check()
            if time.monotonic() > deadline:
                raise TerminalError(f"timed out after {timeout:.0f} s waiting for {what}; screen:\n{screen}\n"
                                    f"its threads:\n{self.stacks() if self.alive() else '(exited)'}")
            time.sleep(0.05)

    def wait_text(self, *needles: str, timeout: float = TIMEOUT) -> str:
        return self.wait_for(lambda s: all(n in s for n in needles), f"{needles!r} on screen", timeout)

    def settle(self, timeout: float = TIMEOUT) -> str:
        """Wait until the program has drawn everything it was asked to (the screen stops
        changing for a moment). Sampling keeps redrawing numbers, so 'stops changing'
        means: no new bytes for 0.3 s, or the same screen twice 0.3 s apart."""
        deadline = time.monotonic() + timeout
        last_len, last_screen = -1, None
        while time.monotonic() < deadline:
            self.check()
            with self._lock:
                n = len(self.raw)
            screen = self.text()
            if n == last_len or screen == last_screen:
                return screen
            last_len, last_screen = n, screen
            time.sleep(0.3)
        return self.text()

    def stacks(self) -> str:
        """Where every thread of a program that stopped answering is (faulthandler's dump on
        SIGABRT); the program dies of it."""
        with self._lock:
            start = len(self.raw)
        try:
            os.kill(self.proc.pid, signal.SIGABRT)
            self.proc.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.5)  # the reader takes what is left in the pty
        with self._lock:
            return bytes(self.raw[start:]).decode("utf-8", "replace")

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            screen = self.text()
            raise TerminalError(f"traintop {' '.join(self.args)} did not exit within {timeout:.0f} s; "
                                f"screen:\n{screen}\nits threads:\n{self.stacks()}") from None
        self._reader.join(5)
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(10)
        self._closed = True
        self._reader.join(5)
        try:
            os.close(self._master)
        except OSError:
            pass

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

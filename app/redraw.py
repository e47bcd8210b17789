"""When the dashboard draws a new frame: at once when a finding starts or ends, otherwise at
most ``max_fps`` times a second, the newest frame once the budget allows. Redraws are the
UI's main cost; sampling and recording keep the feed's interval."""

from __future__ import annotations

import time

REDRAW_SLACK = 0.2  # a frame due within this share of the redraw interval is drawn at once


class RedrawPacer:
    def __init__(self, app, max_fps: float | None) -> None:
        self.app = app  # refresh_view, set_timer, paused, is_running, monitor
        self.min_redraw_s = 1.0 / max_fps if max_fps else 0.0
        self._last = 0.0
        self._timer = None
        self._drawn_alert_changes = 0

    def drawn(self, alert_changes: int) -> None:
        """A frame was drawn now, with the findings as of ``alert_changes``."""
        self._last = time.monotonic()
        self._drawn_alert_changes = alert_changes

    def frame_ready(self) -> None:
        app = self.app
        if app.monitor.alert_changes != self._drawn_alert_changes:  # a finding starts or ends: now, not later
            if self._timer is not None:
                self._timer.stop()
                self._timer = None
            app.refresh_view()
            return
        if self._timer is not None:
            return
        wait = self._last + self.min_redraw_s - time.monotonic()
        # A frame that comes a little early (sampling at the redraw rate, give or take the loop's
        # jitter) is drawn now: a timer for a few milliseconds costs more than it saves.
        if wait > REDRAW_SLACK * self.min_redraw_s:  # draw the newest frame once the redraw budget allows
            self._timer = app.set_timer(wait, self._deferred)
        else:
            app.refresh_view()

    def _deferred(self) -> None:
        self._timer = None
        if not self.app.paused and self.app.is_running:
            self.app.refresh_view()

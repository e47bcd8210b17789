"""What a log read whole into memory offers replay and analyze, as a recording does: its span,
its samples in time order, and no alerts of its own (a log was never judged)."""

from __future__ import annotations

from array import array

from traintop.samples import Frame


class LogTimeline:
    """Over ``_times`` (its samples' times, sorted) and the ``frames()`` of the log."""

    _times: array  # its samples' times (floats), sorted

    @property
    def t_start(self) -> float | None:
        return self._times[0] if self._times else None

    @property
    def t_end(self) -> float | None:
        return self._times[-1] if self._times else None

    @property
    def frame_count(self) -> int:
        return len(self._times)

    def frames(self, t_from: float | None = None, t_to: float | None = None):
        raise NotImplementedError

    @property
    def frames_list(self) -> list[Frame]:
        return list(self.frames())

    def alerts(self) -> list:
        return []

"""Errors that reach the user as one line, never as a traceback."""


class TraintopError(Exception):
    """A problem the user can act on; its message is printed as one line.

    Messages often quote text from elsewhere (SQLite's errors quote a file's schema, which a
    hostile file controls): whitespace, newlines included, is folded here, once for all.
    """

    def __init__(self, message: object = "") -> None:
        super().__init__(" ".join(str(message).split()))


class RecordingError(TraintopError):
    """A recording that cannot be read (corrupt, truncated, wrong version, hostile)."""


class NoGpuError(TraintopError):
    """NVML is missing or sees no GPU."""


class NoTraintopSeries(TraintopError):
    """A Prometheus holds no traintop series for the time asked (dcgm-exporter's may stand in).
    ``longer``: the option of the command that asked which reaches further back."""

    def __init__(self, shown_url: str, longer: str = "--since") -> None:
        self.shown_url = shown_url
        super().__init__(f"no traintop series at {shown_url} between the times asked "
                         f"(is `traintop agent` scraped? try a longer {longer})")

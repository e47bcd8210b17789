"""Errors that reach the user as one line, never as a traceback."""


class TraintopError(Exception):
    """A problem the user can act on; its message is printed as one line."""


class RecordingError(TraintopError):
    """A recording that cannot be read (corrupt, truncated, wrong version, hostile)."""


class NoGpuError(TraintopError):
    """NVML is missing or sees no GPU."""

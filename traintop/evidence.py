"""Evidence captured when a finding starts: which finding asks for what, and the files kept.

When a finding of CAPTURE_ON starts in a live session with the probe, traintop asks the job's
probe (traintop/probe_capture.py) for a profiler trace of a few steps or a CUDA memory snapshot,
once per finding; the probe itself allows one of each kind per 10 minutes. A recording keeps a
copy of each file beside it (``RUN.ttrec.captures/``) and lists it; ``analyze`` names the viewer.
"""

from __future__ import annotations

import os
import stat

from traintop.samples import Capture

CAPTURE_ON = {  # rule -> what to capture when its finding starts
    "starvation": "trace", "underuse": "trace", "straggler": "trace", "precision": "trace", "pause": "trace",
    "step_regression": "trace",
    "oom": "memory", "memory_creep": "memory", "fragmentation": "memory",
}
VIEWER = {
    "trace": "open in https://ui.perfetto.dev (or chrome://tracing; or `tensorboard --logdir` on its folder, "
             "with the torch-tb-profiler plugin)",
    "memory": "drop on https://pytorch.org/memory_viz",
}
MAX_BYTES = {"trace": 256 << 20, "memory": 1 << 30}


def captures_dir(recording: str) -> str:
    return recording + ".captures"


def keep_beside(recording: str, cap: Capture) -> str | None:
    """Copy the capture's file into the recording's folder of captures (created 0700); its new path,
    or None when there is nothing to copy. Never follows a symlink, never overwrites (raises OSError)."""
    if cap.path is None or cap.error:
        return None
    folder = captures_dir(recording)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        if os.path.islink(folder) or not os.path.isdir(folder):
            raise OSError(f"{folder} is not a directory of ours") from None
    dst = os.path.join(folder, os.path.basename(cap.path))
    limit = MAX_BYTES.get(cap.kind, 0)
    # non-blocking: a FIFO put in its place must not hang the sampler; only a plain file is copied
    src_fd = os.open(cap.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(src_fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{cap.path} is not a plain file")
        if st.st_size > limit:
            raise OSError(f"{cap.path} is larger than {limit >> 20} MiB")
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            copied = 0
            while chunk := os.read(src_fd, 1 << 20):
                copied += len(chunk)
                if copied > limit:
                    raise OSError(f"{cap.path} grew past {limit >> 20} MiB")
                os.write(dst_fd, chunk)
        except BaseException:
            os.close(dst_fd)
            os.unlink(dst)
            raise
        os.close(dst_fd)
    finally:
        os.close(src_fd)
    return dst


def short(cap: Capture) -> str:
    """A panel's line: 'trace on Data starvation: PATH (step time 25.0 ms before, 25.1 ms after it: +0.4 %)':
    what the capture cost the job's steps (a profiler can leave them slower)."""
    why = f" on {cap.reason}" if cap.reason else ""
    if cap.error:
        return f"{cap.kind}{why} failed: {cap.error}"
    out = f"{cap.kind}{why}: {cap.path}"
    if cap.step_s_before and cap.step_s_after:
        out += (f" (step time {cap.step_s_before * 1000:.1f} ms before, {cap.step_s_after * 1000:.1f} ms after it: "
                f"{(cap.step_s_after / cap.step_s_before - 1) * 100:+.1f} %)")
    return out


def describe(cap: Capture) -> str:
    """One line: what was captured, why, where, and how the steps fared."""
    what = {"trace": "profiler trace", "memory": "memory snapshot"}.get(cap.kind, cap.kind)
    why = f" (on {cap.reason})" if cap.reason else ""
    if cap.error:
        return f"{what}{why} failed: {cap.error}"
    line = f"{what}{why}: {cap.path} — {VIEWER.get(cap.kind, '')}"
    if cap.step_s_before and cap.step_s_after:
        change = (cap.step_s_after / cap.step_s_before - 1) * 100
        line += (f"; steps {cap.step_s_before * 1000:.1f} ms before, {cap.step_s_after * 1000:.1f} ms after "
                 f"({change:+.1f} %)")
    return line

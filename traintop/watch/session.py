"""One session of watching: what the dashboard, `traintop record`, `traintop run` and the node
agent each hold. The builders are in ``traintop.watch.sessions``.

It owns the monitor and the feed, the kind (``SessionKind``, carried by the feed), the replay
controls, recording (the one route for ``--record`` and the dashboard's ``r`` key), the
requests for thread stacks, the ``--on-finding`` hook and the job ``traintop run`` started.
No Textual here: a front end draws it and calls it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from traintop.errors import TraintopError
from traintop.watch.feeds import Feed
from traintop.watch.monitor import Monitor
from traintop.record.recording import default_recording_dir, new_recording_path
from traintop.watch.replay_controls import ReplayControls
from traintop.samples import SessionKind

if TYPE_CHECKING:
    from traintop.record.export import StreamWriter


class Session:
    def __init__(self, monitor: Monitor, feed: Feed, *, record_dir: str | None = None, job=None) -> None:
        self.monitor = monitor
        self.feed = feed
        self.record_dir = record_dir  # where the dashboard's r key records (None: the per-user default)
        self.job = job  # traintop.watch.job.Job that `traintop run` started, or None
        self.replay: ReplayControls | None = feed.replay_controls()
        self._streams: list = []

    # Read as the pair (monitor, feed), for code that needs only those two.
    def __iter__(self):
        return iter((self.monitor, self.feed))

    def __getitem__(self, k: int):
        return (self.monitor, self.feed)[k]

    @property
    def kind(self) -> SessionKind:
        return SessionKind(self.feed.kind)

    @kind.setter
    def kind(self, kind: SessionKind | str) -> None:
        self.feed.kind = SessionKind(kind)

    # -- running ----------------------------------------------------------------------
    def start(self, notify=None) -> None:
        """Start the feed's thread; ``notify`` runs on it after each tick."""
        self.feed.start(notify)

    def close(self) -> None:
        """Stop the feed, then close the monitor: its recording and its hook; then the sample streams."""
        self.feed.stop()
        self.monitor.close()
        for writer in self._streams:
            writer.close()

    # -- recording ----------------------------------------------------------------------
    def start_recording(self, path: str | None = None) -> str:
        """Record from now on into ``path``, or a new file in ``record_dir``; the path. Raises
        TraintopError (one line) when it cannot."""
        if path is not None and os.path.isdir(path):
            raise TraintopError(f"{path} is a directory: give a file name in it, e.g. "
                                f"{os.path.join(path, time.strftime('traintop-%Y%m%d-%H%M%S.ttrec'))}")
        return self.monitor.start_recording(path if path is not None else new_recording_path(self.record_dir))

    def stop_recording(self):
        """Stop at once and hand back the writer (None when not recording): the caller closes it,
        seconds for a long session, so a UI does that off its event loop."""
        return self.monitor.stop_recording()

    @property
    def recording_path(self) -> str | None:
        rec = self.monitor.recorder
        return rec.path if rec is not None else None

    def stream_samples(self, out) -> "StreamWriter":
        """Write each sample from now on to ``out`` as a JSON line (traintop/record/export.py), through a
        bounded queue: a slow reader loses lines, the sampling never waits. Closed with the session."""
        from traintop.record import export

        writer = export.StreamWriter(out)
        info = self.monitor.info
        self.monitor.sample_sinks.append(lambda frame: writer.put(export.json_line(export.sample_record(frame, info))
                                                                  + "\n"))
        self._streams.append(writer)
        return writer

    def where_things_go(self) -> list[tuple[str, str]]:
        """Where the files traintop writes go (the dashboard's help says)."""
        out = []
        if self.replay is None:
            path = self.recording_path
            out.append(("recording", path) if path is not None
                       else ("recordings", f"{self.record_dir or default_recording_dir()} (key r)"))
        if self.job is not None:
            out.append(("job's output", self.job.log_path))
        return out

    # -- the job's thread stacks -----------------------------------------------------------
    def ask_for_stacks(self) -> str:
        """Ask the job's probes for every thread's stack where they can answer now; the situation
        a stacks view explains: "asked", or why none will come ("recording", "simulated",
        "no probe", "ended")."""
        m = self.monitor
        if self.replay is not None:
            return "recording"
        if self.kind == SessionKind.SIMULATED:
            return "simulated"
        if m.probe_seen_at is None:
            return "no probe"
        if m.ended_at is not None:
            return "ended"
        m.request_stacks()
        return "asked"

    def has_stacks(self, view) -> bool:
        """A live job carries the probe (or a recording holds its stacks): there are stacks to show."""
        live_probe = self.kind == SessionKind.LIVE and view is not None and bool(view.process.ranks)
        return live_probe or bool(self.monitor.stacks)

    # -- --on-finding ----------------------------------------------------------------------
    def attach_hook(self, hook, host: str | None = None) -> None:
        """Tell ``hook`` (traintop.watch.hooks.FindingHook) when a warning or worse starts or ends on
        ``host`` (default: this session's host); closing the session closes it. One hook may
        serve several sessions (the agent's hosts)."""
        if hook is not None:
            self.monitor.attach_finding_hook(hook, host=host)

    def on_finding(self, command: str | None, say=None, host: str | None = None):
        """``--on-finding CMD``: build the hook (None without a command) and attach it; ``say``
        tells of its first failure where a line can be printed (not under the dashboard)."""
        from traintop.watch.hooks import finding_hook

        hook = finding_hook(command, say)
        self.attach_hook(hook, host)
        return hook

    def hook_problem(self) -> str | None:
        hook = self.monitor.hook
        return hook.problem() if hook is not None else None

    # -- `traintop run` ------------------------------------------------------------------
    def attach_job(self, job) -> None:
        """The job `traintop run` started: its end is shown at once, and q asks about it."""
        self.job = job
        job.on_end(self.monitor.end_job)

    def job_running(self) -> bool:
        """The job `traintop run` started goes on (not ended, no signal passed on to it)."""
        job = self.job
        return job is not None and job.end is None and not job.signals_received

    def stop_job(self, grace: float) -> None:
        """SIGTERM to the job's whole group, SIGKILL after ``grace`` seconds (the CLI waits for
        that once the dashboard is gone)."""
        if self.job_running():
            self.job.forward(signal.SIGTERM, grace)

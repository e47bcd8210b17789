"""The core session: frames in, store and alerts updated, recording written.

Thread-safe: a feed thread calls ``ingest``; the UI reads ``snapshot`` from its own
thread. Nothing here knows about Textual.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import TYPE_CHECKING

from traintop.errors import RecordingError, TraintopError
from traintop.record.evidence import CAPTURE_ON
from traintop.rules import RULES_VERSION, RulesEngine, default_engine
from traintop.findings import Finding
from traintop.rules.config import host_values
from traintop.samples import Frame, SessionInfo, StackDump
from traintop.store import Store

if TYPE_CHECKING:
    from traintop.watch.hooks import FindingEvents, FindingHook


class Monitor:
    def __init__(self, info: SessionInfo, *, store: Store | None = None, engine: RulesEngine | None = None,
                 recorder=None) -> None:
        self.info = info
        self.store = store if store is not None else Store()  # an empty Store is falsy
        self.engine = engine if engine is not None else default_engine()
        self.recorder = None
        self.sample_sinks: list = []  # called with each sample after it is taken in (record --jsonl)
        self.lock = threading.RLock()
        # Bumped when an alert starts, ends or changes severity (not when only its evidence's
        # figures move, as they do every second): the dashboard draws such a frame at once.
        self.alert_changes = 0
        self._alerts_shown: frozenset = frozenset()
        self.recording_error: str | None = None
        self.source_error: str | None = None
        self.collector_errors: dict[str, str] = {}  # collector -> why it fails now (live sampling)
        self.ended_at: float | None = None
        self.probe_seen_at: float | None = None  # the latest sample with the job's probe data (ranks)
        self.last_ranks: tuple = ()  # that sample's ranks (the panel keeps them once the job has ended)
        self.launched = False  # the attached process was started by `traintop run` (with the probe)
        self.job_end = None  # traintop.watch.job.JobEnd of a launched job, as soon as it is reaped
        self.stacks: dict[int, StackDump] = {}  # the latest thread stacks of each probed process
        self.capture_evidence = False  # ask the probe for a trace or a memory snapshot when a finding starts
        self.captures_wanted: list[str] = []  # kinds the live feed passes to the probes
        self._capture_for: dict[str, str] = {}  # kind -> the finding that asked for it (its title)
        self._captured_findings: set[int] = set()
        self.captures: list = []  # what the probes captured (traintop.samples.Capture), newest last
        self.stacks_wanted = False  # the user asked for them; the live feed passes it to the probes
        self.hook: FindingHook | None = None  # --on-finding: told when a warning or worse starts or ends
        self._finding_events: FindingEvents | None = None
        if recorder is not None:
            self.attach_recorder(recorder)

    def start_recording(self, path: str, **writer_options) -> str:
        """Record from now on into a new file at ``path`` (the one route for ``--record`` and the
        dashboard's ``r`` key). Raises RecordingError (one line) when it cannot be created."""
        from traintop.record.recording import RecordingWriter

        with self.lock:
            if self.recorder is not None:
                raise TraintopError(f"already recording to {self.recorder.path}")
            recorder = RecordingWriter(path, self.info, **writer_options)
            self.recording_error = None
            self.attach_recorder(recorder)
        return path

    def stop_recording(self):
        """Stop recording at once (no frame is written after this returns) and hand back the writer,
        or None. The caller closes it: closing checkpoints and compacts the file, seconds for a long
        session, so a UI does it off its event loop."""
        with self.lock:
            recorder, self.recorder = self.recorder, None
            self.recording_error = None
        return recorder

    def attach_recorder(self, recorder) -> None:
        """Record from now on. The file says which rules judged it, and gets the alerts already
        active, so `traintop analyze` can trust its alerts instead of re-running every rule."""
        with self.lock:
            try:
                recorder.set_meta("rules", json.dumps({"version": RULES_VERSION,
                                                       "thresholds": host_values(self.engine.config)}))
                for a in self.engine.active:
                    recorder.alert(a)
            except RecordingError as e:
                self.recording_error = str(e)
            self.recorder = recorder
            if hasattr(recorder, "on_captures"):
                recorder.on_captures = self._kept_beside

    def attach_finding_hook(self, hook, host: str | None = None) -> None:
        """Run ``hook`` (--on-finding) from now on; this monitor closes it."""
        from traintop.watch.hooks import FindingEvents

        with self.lock:
            self.hook = hook
            self._finding_events = FindingEvents(host or self.info.hostname or "localhost")
            self._alerts_shown = frozenset(("hook attached",))  # the next evaluation tells it what is up

    def ingest(self, frame: Frame, evaluate: bool = True) -> list[Finding]:
        hook: FindingHook | None = None
        events: list[dict] = []
        t = round(frame.t * 1000) / 1000  # a sample's time to the millisecond, as a recording keeps it
        if t != frame.t:  # so the rules judge live what a re-run or a replay of the recording judges
            frame = dataclasses.replace(frame, t=t)
        with self.lock:
            p = frame.process
            if p is not None and not p.alive and self.ended_at is None:
                self.ended_at = frame.t  # the history stays; the panel says when it ended
            self.store.add(frame)
            if frame.ranks:
                self.probe_seen_at, self.last_ranks = frame.t, frame.ranks
            for dump in frame.stacks:
                self.stacks[dump.pid] = dump
                if dump.reason == "pause":
                    self.engine.pause_stacks[dump.pid] = dump
            changed = self.engine.evaluate(self.store, frame.t) if evaluate else []
            if changed and self.capture_evidence:
                self._ask_for_evidence()
            if frame.captures:
                frame = self._took_evidence(frame)
            if changed:  # something started, ended, or only its evidence moved: which?
                active = self.engine.active
                shown = frozenset((a.id, a.severity, a.explained_by) for a in active)
                if shown != self._alerts_shown:
                    self._alerts_shown = shown
                    self.alert_changes += 1
                    hook, finding_events = self.hook, self._finding_events
                    if hook is not None and finding_events is not None:  # attached together
                        events = finding_events.update(active, frame.t)
        if hook is not None:
            for event in events:
                hook.submit(event)  # a queue: the command runs on the hook's own thread
        self._record(frame, changed)
        return changed

    def _ask_for_evidence(self) -> None:
        for f in self.engine.active:
            kind = CAPTURE_ON.get(f.rule)
            if kind is None or f.id in self._captured_findings or f.explained_by:
                continue
            self._captured_findings.add(f.id)
            if kind not in self.captures_wanted:
                self.captures_wanted.append(kind)
                self._capture_for[kind] = f.title

    def _took_evidence(self, frame: Frame) -> Frame:
        """Keep the captures (with the finding that asked); a recorder copies their files beside it,
        off this thread, and tells ``_kept_beside`` when each is done."""
        kept = []
        for cap in frame.captures:
            if cap.follow_up:
                self.captures = [dataclasses.replace(c, step_s_after=cap.step_s_after)
                                 if c.pid == cap.pid and c.kind == cap.kind and c.step_s_after is None else c
                                 for c in self.captures]
                kept.append(cap)
                continue
            cap = dataclasses.replace(cap, reason=self._capture_for.get(cap.kind, ""))
            self.captures = (self.captures + [cap])[-16:]
            kept.append(cap)
        return dataclasses.replace(frame, captures=tuple(kept))

    def _kept_beside(self, done: list, removed: list[str], why_removed: str) -> None:
        """The recorder's copies: each capture's new path (or why it was not kept), and the copies
        removed to hold the folder to its budget."""
        with self.lock:
            for cap in done:
                self.captures = [dataclasses.replace(cap, step_s_after=c.step_s_after or cap.step_s_after)
                                 if (c.pid, c.kind, c.t) == (cap.pid, cap.kind, cap.t) else c for c in self.captures]
            gone = set(removed)
            self.captures = [dataclasses.replace(c, error=why_removed) if c.path in gone and not c.error else c
                             for c in self.captures]

    def ingest_many(self, frames: list[Frame]) -> None:
        """``ingest(f, evaluate=False)`` for each of ``frames``, the store filled in one go (a
        replay's seek rebuilding the history the view shows)."""
        with self.lock:
            for f in frames:
                p = f.process
                if p is not None and not p.alive and self.ended_at is None:
                    self.ended_at = f.t
                if f.ranks:
                    self.probe_seen_at, self.last_ranks = f.t, f.ranks
                for dump in f.stacks:
                    self.stacks[dump.pid] = dump
            self.store.extend(frames)
        for f in frames:
            self._record(f, [])

    def ingest_series(self, window) -> None:
        """``ingest_many`` for a window of samples decoded straight into series
        (``codec.SeriesWindow``): nothing recorded, no rules run (a replay's seek)."""
        with self.lock:
            if window.ended_at is not None and self.ended_at is None:
                self.ended_at = window.ended_at
            if window.probe_at is not None:
                self.probe_seen_at = window.probe_at
            self.store.extend_series(window.times, window.columns, window.last)

    def end_job(self, end) -> None:
        """A launched job has ended (exit code or signal, and when): the view says so at once."""
        with self.lock:
            self.job_end = end
            if self.ended_at is None:
                self.ended_at = end.t

    def _record(self, frame: Frame, changed: list[Finding]) -> None:
        for sink in self.sample_sinks:
            sink(frame)
        rec = self.recorder
        if rec is None or self.recording_error:
            return
        try:
            rec.add(frame)
            for a in changed:
                rec.alert(a)
        except RecordingError as e:
            # The live view goes on; what was committed stays readable.
            self.recording_error = str(e)

    def request_stacks(self) -> None:
        """Ask the attached job's probes for every thread's Python stack (live sessions only)."""
        self.stacks_wanted = True

    def reset(self) -> None:
        """Forget history (replay seeks)."""
        with self.lock:
            self.store = Store(self.store.capacity)
            self.engine.reset()
            self.ended_at = None
            self.probe_seen_at = None
            self.last_ranks = ()
            self.stacks = {}

    def close(self) -> None:
        with self.lock:
            t = self.store.t_last
            ended = self.engine.close_all(t) if t is not None else []  # traintop stops, not the findings: no hook
        if self.hook is not None:
            self.hook.close()
        if self.recorder is not None and not self.recording_error:
            try:
                for a in ended:
                    self.recorder.alert(a)
                self.recorder.close()
            except RecordingError as e:
                self.recording_error = str(e)

"""Builds a Session for each way of watching: live, simulated, replay, demo, and the node
agent's live view of every job here.

Shared by the dashboard, the headless recorder, `traintop run`, the agent and the tests. No
Textual here.
"""

from __future__ import annotations

import time
from typing import cast

from traintop.errors import NoGpuError, RecordingError, TraintopError
from traintop.watch.feeds import ReplayFeed, SourceFeed
from traintop.sources.live import LiveSampler
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader
from traintop.rules import Thresholds, default_engine
from traintop.samples import SessionInfo, SessionKind
from traintop.watch.session import Session
from traintop.store import Store

MIN_INTERVAL, MAX_INTERVAL = 0.05, 60.0


def check_interval(interval: float) -> float:
    if not (MIN_INTERVAL <= interval <= MAX_INTERVAL):
        raise TraintopError(f"--interval must be between {MIN_INTERVAL} and {MAX_INTERVAL:g} seconds (got {interval:g})")
    return interval


def _store_for(interval: float) -> Store:
    # 15 minutes of raw points (at least 1200, at most 6000): the longest rule window is 5 minutes
    # and the sparklines show 240 points; what is older lives in the recording.
    return Store(capacity=max(1200, min(6000, int(900 / interval))))


def _monitor(info: SessionInfo, interval: float, config: Thresholds | None) -> Monitor:
    return Monitor(info, store=_store_for(interval), engine=default_engine(config) if config else None)


def _session(monitor: Monitor, feed, record: str | None) -> Session:
    session = Session(monitor, feed)
    if record:
        session.start_recording(record)  # the route the dashboard's r key takes too
    return session


def no_gpu_info(interval: float, why: str) -> SessionInfo:
    """A live session's info where NVML sees no GPU: the host (and the job) only, and why."""
    import socket

    return SessionInfo(kind=SessionKind.LIVE, hostname=socket.gethostname(), interval=interval,
                       label="no GPU", extra={"no_gpu": why})


def _open_gpus(interval: float, only: frozenset[int] | None, require_gpu: bool):
    """NVML's collector and the session's info; without a GPU (and not ``require_gpu``) no
    collector, and the info says why."""
    from traintop.collectors.nvml import NvmlCollector

    try:
        # Sampling once a second or slower, a 2-s window halves the cost of the utilization buffer.
        gpu = NvmlCollector(window_s=1.0 if interval < 1.0 else 2.0, only=only)
    except NoGpuError as e:
        if require_gpu:
            raise
        return None, no_gpu_info(interval, str(e))
    info = gpu.session_info(interval)
    gpu.start_slow()
    return gpu, info


def live_session(interval: float = 0.5, pid: int | None = None, record: str | None = None,
                 config: Thresholds | None = None, require_gpu: bool = True, probe_dir: str | None = None,
                 own_child: bool = False, only_gpus: frozenset[int] | None = None, capture: bool = True) -> Session:
    """Live collectors. Raises NoGpuError when NVML sees no GPU and ``require_gpu``.
    ``only_gpus``: NVML indices to watch (the others are never read).

    ``own_child``: ``pid`` was started by this traintop (`traintop run`) and may already have
    ended; ``probe_dir`` is where its probe listens."""
    from traintop.collectors.host import HostCollector
    from traintop.collectors.owner_cache import OwnerCache
    from traintop.collectors.process import ProcessCollector

    check_interval(interval)
    proc = ProcessCollector(pid, ended_ok=own_child) if pid is not None else None  # fail fast on a bad PID
    gpu, info = _open_gpus(interval, only_gpus, require_gpu)
    probes = None
    if proc is not None:  # the probe's reader only for an attached job
        from traintop.collectors.probe_client import ProbeClient

        probes = ProbeClient(probe_dir)
    sampler = LiveSampler(gpu=gpu, host=HostCollector(), process=proc, probes=probes,
                          gpu_timeout=max(1.0, 2 * interval), owners=OwnerCache() if gpu is not None else None)
    monitor = _monitor(info, interval, config)
    monitor.launched = own_child
    monitor.capture_evidence = capture and probes is not None
    feed = SourceFeed(monitor, sampler, interval, kind=SessionKind.LIVE)
    session = _session(monitor, feed, record)
    feed.closers = [lambda: _note_probe_errors(monitor, probes), sampler.close]
    return session


def agent_session(interval: float, record: str | None = None, config: Thresholds | None = None,
                  only: frozenset[int] | None = None, probes_per_user: int | None = None) -> Session:
    """A node agent's live session: the GPUs (``only``: these NVML indices), the host, and the
    probe of every job here (``collectors.node``). Without a GPU it serves the host and the
    probes, and its source says why (``gpu_problem``). ``probes_per_user``: connections to one
    user's probes at most (collectors/probe_limits.py)."""
    from traintop.collectors.host import HostCollector
    from traintop.collectors.node import AgentSampler, AllProbes, nvidia_hardware_present
    from traintop.collectors.probe_limits import ProbeLimits

    check_interval(interval)
    limits = ProbeLimits() if probes_per_user is None else ProbeLimits(per_user=probes_per_user)
    gpu, info = _open_gpus(interval, only, require_gpu=False)
    sampler = AgentSampler(LiveSampler(gpu=gpu, host=HostCollector(), gpu_timeout=max(1.0, 2 * interval)),
                           AllProbes(limits=limits), only)
    if gpu is None:
        sampler.gpu_problem = info.extra["no_gpu"]
        sampler.gpus_unreadable = nvidia_hardware_present()
    monitor = _monitor(info, interval, config)
    feed = SourceFeed(monitor, sampler, interval, kind=SessionKind.LIVE)
    session = _session(monitor, feed, record)
    feed.closers = [sampler.close]
    return session


def _note_probe_errors(monitor: Monitor, probes) -> None:
    """The recording says how many probe messages were dropped as malformed, and how many capture
    records no request called for (analyze shows them)."""
    if probes is None or monitor.recorder is None or monitor.recording_error:
        return
    try:
        for key, count in (("probe_bad_messages", probes.bad_messages),
                           ("probe_unasked_captures", getattr(probes, "unasked_captures", 0))):
            if count:
                monitor.recorder.set_meta(key, str(count))
    except RecordingError as e:
        monitor.recording_error = str(e)


def simulated_session(scenario: str = "healthy", gpus: int = 1, seed: int = 0, interval: float = 0.5,
                      history_s: float = 0.0, record: str | None = None, realtime: bool = True,
                      t0: float | None = None, config: Thresholds | None = None) -> Session:
    """The simulator. Live (``realtime``) its clock starts at launch: no made-up history, so an
    alert's "since" is time the user watched (tests and screenshots ask for ``history_s``)."""
    from traintop.collectors.simulated import Simulator

    check_interval(interval)
    try:
        n_hist = int(history_s / interval)
        start = t0 if t0 is not None else (time.time() - n_hist * interval if realtime else 1_790_000_000.0)
        sim = Simulator(scenario, gpus=gpus, seed=seed, interval=interval, t0=start)
    except ValueError as e:
        raise TraintopError(str(e)) from None
    monitor = _monitor(sim.info(), interval, config)
    feed = SourceFeed(monitor, sim, interval, kind=SessionKind.SIMULATED)
    session = _session(monitor, feed, record)
    feed.prefill(n_hist)
    return session


def open_source(path: str, fields: list[str] | None = None):
    """A traintop recording, or an nvidia-smi query/dmon log (imported)."""
    from traintop.sources import importers
    from traintop.files import open_regular

    with open_regular(path) as fh:  # a FIFO or a device is refused here, before any read
        is_sqlite = fh.read(16) == b"SQLite format 3\x00"
    if is_sqlite or path.endswith(".ttrec"):
        return RecordingReader(path)
    return importers.load(path, fields)


def _replayed_label(recorded: str | None) -> str:
    """A recording's label as its replay shows it: "live" was true when it was made, not now."""
    if not recorded or recorded == "replay":
        return "replay"
    return "recorded live" if recorded == "live" else recorded


def replay_session(path: str, *, loop: bool = False, kind: SessionKind | str = SessionKind.REPLAY,
                   speed: float = 1.0, fields: list[str] | None = None, config: Thresholds | None = None) -> Session:
    reader = open_source(path, fields)
    if reader.t_start is None:
        raise TraintopError(f"{path} is damaged: no sample in it could be read; nothing to replay"
                            if getattr(reader, "salvaged", False) else f"{path} holds no samples")
    info = reader.info
    kind = SessionKind(kind)
    info = SessionInfo(kind=kind, gpus=info.gpus, driver=info.driver, cuda_driver=info.cuda_driver,
                       hostname=info.hostname, interval=info.interval, label=_replayed_label(info.label),
                       extra=info.extra)
    monitor = _monitor(info, info.interval, config)
    feed = ReplayFeed(monitor, reader, loop=loop, kind=kind)
    feed.speed = speed
    if not monitor.store and feed.peek() is None:  # every chunk damaged: nothing would ever play
        skipped = getattr(reader, "skipped_chunks", 0)
        why = getattr(reader, "damage", None) or "all damaged"
        cut = getattr(reader, "cut", None)
        how = f" (cut short: {cut[0]:,} of the {cut[1]:,} bytes its header counts)" if cut else ""
        if not skipped and getattr(reader, "salvaged", False):
            raise TraintopError(f"{path} is damaged{how}: no sample in it could be read; nothing to replay")
        raise TraintopError(f"{path}{how}: none of its {getattr(reader, 'chunk_total', skipped)} chunk(s) could be "
                            f"read ({why}); nothing to replay")
    return Session(monitor, feed)


def demo_path() -> str | None:
    from importlib import resources  # here: its import costs the recorder 2 MiB of RSS

    try:
        ref = resources.files("traintop.demo").joinpath("h200-demo.ttrec")
    except (ModuleNotFoundError, FileNotFoundError):
        return None
    return str(ref) if ref.is_file() else None


def demo_session(config: Thresholds | None = None) -> Session:
    """The embedded demo: a real H200 recording replayed in a loop."""
    path = demo_path()
    if path is None:
        raise TraintopError("the embedded demo recording is missing from this installation")
    session = replay_session(path, loop=True, kind=SessionKind.DEMO, config=config)
    cast(ReplayFeed, session.feed).speed = 1.0
    return session

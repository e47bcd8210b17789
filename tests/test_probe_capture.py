"""The probe's captures (a profiler trace, a CUDA memory snapshot) on a real (CPU) torch job;
the CUDA path on a fake torch.cuda.memory that records its calls."""

import contextlib
import gzip
import json
import os
import pickle
import stat
import statistics
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from traintop.injob import capture as probe_capture  # noqa: E402
from traintop.injob.capture import AROUND, SETTLE, STEPS, Capturer  # noqa: E402


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    # a capture sets TEARDOWN_CUPTI in the process: leave the test process as it was
    monkeypatch.setenv("TEARDOWN_CUPTI", "unset")
    monkeypatch.delenv("TEARDOWN_CUPTI")


def make_job():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def step():
        loss = m(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


@contextlib.contextmanager
def hooked(cap):
    """on_step from a global optimizer step post hook, as the probe calls it."""
    handle = sys.modules["torch.optim.optimizer"].register_optimizer_step_post_hook(lambda *a, **k: cap.on_step())
    try:
        yield
    finally:
        handle.remove()


def timed_steps(step, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return out


class FakeProfile:
    """Stands in for torch.profiler.profile: records its calls and the thread of each."""

    def __init__(self, calls, step_raises=False, export_bytes=b'{"traceEvents": []}', **kwargs):
        self.calls, self.step_raises, self.export_bytes = calls, step_raises, export_bytes
        calls.append(("init", kwargs, threading.get_ident()))

    def start(self):
        self.calls.append(("start", None, threading.get_ident()))

    def stop(self):
        self.calls.append(("stop", None, threading.get_ident()))
        if self.step_raises:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED\nmore detail")

    def export_chrome_trace(self, path):
        self.calls.append(("export", path, threading.get_ident()))
        with open(path, "wb") as f:
            f.write(self.export_bytes)


@pytest.fixture
def fake_profile(monkeypatch):
    calls = []
    opts = {}

    def factory(**kwargs):
        return FakeProfile(calls, **opts, **kwargs)

    monkeypatch.setattr(torch.profiler, "profile", factory)
    return calls, opts


class Clock:
    """A clock the test moves."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def names(calls):
    return [c[0] for c in calls]


def partial_overlaps(events) -> list[tuple]:
    """Complete ('X') slices of one thread that overlap without nesting, as (outer, inner) names:
    a viewer that draws a thread's slices as a stack (Perfetto) cannot show them. Integer
    nanoseconds, as Perfetto compares them."""
    tracks: dict = {}
    for e in events:
        if e.get("ph") == "X":
            start = round(float(e["ts"]) * 1000)
            tracks.setdefault((e.get("pid"), e.get("tid")), []).append((start, start + round(float(e["dur"]) * 1000),
                                                                        str(e.get("name"))))
    bad = []
    for slices in tracks.values():
        open_: list[tuple] = []
        for start, end, name in sorted(slices, key=lambda x: (x[0], -x[1])):
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                bad.append((open_[-1][2], name))
                continue
            open_.append((start, end, name))
    return bad


def test_the_overlap_check_finds_slices_that_do_not_nest():
    x = lambda ts, dur, name: {"ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 1, "name": name}  # noqa: E731
    assert partial_overlaps([x(0, 10, "step"), x(2, 3, "op"), x(5, 5, "op2")]) == []
    assert partial_overlaps([x(0, 10, "ProfilerStep#1"), x(8, 5, "Optimizer.step")]) == [("ProfilerStep#1",
                                                                                         "Optimizer.step")]


@pytest.mark.slow  # the profiler's first start takes seconds
def test_a_trace_of_a_cpu_training_loop_is_a_chrome_trace_of_its_steps(tmp_path):
    d = str(tmp_path / "captures")
    cap = Capturer(d)
    assert cap.error is None and stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    step = make_job()
    with hooked(cap):
        before = timed_steps(step, 25)
        assert cap.request("trace", before) is None
        assert cap.busy
        records = []
        for _ in range(STEPS + 2):
            step()
            records += cap.poll()
        assert len(records) == 1 and os.environ.get("TEARDOWN_CUPTI") == "1"  # torch.version.cuda is None here
        rec = records[0]
        assert rec["error"] is None and rec["kind"] == "trace" and rec["steps"] == STEPS
        assert rec["step_s_before"] == pytest.approx(statistics.mean(probe_capture._usual(before[-AROUND:])))
        assert len(rec["step_s_during"]) == STEPS and all(s > 0 for s in rec["step_s_during"])
        assert rec["step_s_after"] is None and abs(rec["t"] - time.time()) < 60
        path = rec["path"]
        assert os.path.dirname(path) == d
        assert os.path.basename(path).startswith(f"capture-{os.getpid()}-") and path.endswith(".pt.trace.json.gz")
        st = os.lstat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == rec["bytes"] > 0
        with gzip.open(path, "rt") as f:  # as Perfetto and TensorBoard's profiler plugin read it
            trace = json.load(f)
        assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
        names = [str(e.get("name", "")) for e in trace["traceEvents"]]
        # the steps inside the capture, marked by the optimizer's own ranges (no ProfilerStep marks:
        # they would overlap them), and their operators
        assert sum(n.startswith("Optimizer.step#") for n in names) >= STEPS - 1
        assert any(n.startswith("aten::addmm") or n.startswith("aten::mm") for n in names)
        assert not any(n.startswith("ProfilerStep#") for n in names)
        assert partial_overlaps(trace["traceEvents"]) == []  # Perfetto's JSON import drops such slices
        assert cap.busy  # until the steps after it are measured
        assert cap.request("memory") == "a capture is already running"
        for _ in range(SETTLE + AROUND):
            step()
        follow = cap.poll()
    assert len(follow) == 1 and set(follow[0]) == {"kind", "path", "step_s_after"}
    assert follow[0]["path"] == path and follow[0]["step_s_after"] > 0
    assert not cap.busy and cap.poll() == []
    assert sorted(os.listdir(d)) == [os.path.basename(path)]  # no temp file left


def test_with_nothing_asked_on_step_does_nothing(tmp_path, monkeypatch):
    def refuse(**kwargs):
        raise AssertionError("the profiler was used")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    cap = Capturer(str(tmp_path / "c"))
    step = make_job()
    with hooked(cap):
        for _ in range(30):
            step()
    assert cap.poll() == [] and not cap.busy and os.listdir(tmp_path / "c") == []
    assert "TEARDOWN_CUPTI" not in os.environ


def test_refusals_one_at_a_time_and_one_of_a_kind_per_ten_minutes(tmp_path, fake_profile):
    clock = Clock()
    cap = Capturer(str(tmp_path / "c"), clock=clock)
    assert cap.request("flamegraph") == "unknown capture kind"
    assert cap.request("trace", [0.1] * 5) is None
    assert cap.request("trace") == "a capture is already running"
    assert cap.request("memory") == "a capture is already running"
    for _ in range(STEPS + 1):
        clock.t += 0.1
        cap.on_step()
    assert [r["error"] for r in cap.poll()] == [None]
    assert cap.request("trace") == "a capture is already running"  # its steps after are measured
    for _ in range(SETTLE + AROUND):
        clock.t += 0.1
        cap.on_step()
    assert [r["step_s_after"] for r in cap.poll()] == [pytest.approx(0.1)]
    assert not cap.busy
    assert cap.request("trace") == "one trace per 10 min"
    clock.t += probe_capture.RATE_S
    assert cap.request("trace") is None


def test_memory_is_refused_without_cuda(tmp_path):
    assert not torch.cuda.is_initialized()
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("memory") == "no CUDA in this process"
    assert not cap.busy
    assert cap.request("trace") is None  # the refusal took no slot


def test_step_timing_and_which_thread_does_what(tmp_path, fake_profile):
    calls, _ = fake_profile
    clock = Clock()
    cap = Capturer(str(tmp_path / "c"), clock=clock)
    assert cap.request("trace", [9.0] * 10 + [0.1] * AROUND) is None  # only the last AROUND count
    assert calls == []  # nothing before the next step end

    def train():
        for dt in [0.5] + [0.2] * STEPS:
            clock.t += dt
            cap.on_step()

    worker = threading.Thread(target=train)  # the training thread
    worker.start()
    worker.join()
    assert names(calls) == ["init", "start", "stop"]
    assert all(c[2] == worker.ident for c in calls)
    kwargs = calls[0][1]
    assert kwargs["activities"] == [torch.profiler.ProfilerActivity.CPU]  # CUDA is not initialised here
    assert (kwargs["record_shapes"], kwargs["with_stack"], kwargs["profile_memory"]) == (False, False, False)
    rec, = cap.poll()
    assert names(calls)[-1] == "export" and calls[-1][2] == threading.get_ident()  # off the training thread
    assert rec["step_s_before"] == pytest.approx(0.1)
    assert rec["step_s_during"] == pytest.approx([0.2] * STEPS)
    assert rec["step_s_after"] is None and rec["bytes"] == os.path.getsize(rec["path"])
    for k in range(SETTLE + AROUND):
        clock.t += 0.3 if k % 2 else 0.1
        cap.on_step()
    follow, = cap.poll()
    assert follow == {"kind": "trace", "path": rec["path"], "step_s_after": pytest.approx(0.2)}
    assert not cap.busy


def test_the_after_median_known_before_the_file_is_written_goes_in_the_one_record(tmp_path, fake_profile):
    clock = Clock()
    cap = Capturer(str(tmp_path / "c"), clock=clock)
    assert cap.request("trace") is None
    for _ in range(STEPS + 1 + SETTLE + AROUND):
        clock.t += 0.1
        cap.on_step()
    rec, = cap.poll()
    assert rec["step_s_after"] == pytest.approx(0.1) and rec["step_s_before"] is None
    assert cap.poll() == [] and not cap.busy


@pytest.mark.parametrize("poll_every_step", [False, True])  # True: the after time comes as a follow-up
def test_the_step_time_after_leaves_out_checkpoints_and_collective_waits(tmp_path, fake_profile, poll_every_step):
    """A job that saves every few seconds (or waits for the rank that saves): the gaps that hold a
    timed checkpoint or barrier are the job's pause, not its pace; an untimed pause (an evaluation)
    is the longest gap and left out as before. Seen on an H200: +26 % read without this."""
    clock = Clock()
    held = [0.0]
    cap = Capturer(str(tmp_path / "c"), clock=clock)
    cap.held = lambda: held[0]
    assert cap.request("trace", [0.1] * AROUND) is None
    out = []
    for k in range(STEPS + 1 + SETTLE + AROUND):
        clock.t += 0.1
        if k in (STEPS + SETTLE + 5, STEPS + SETTLE + 25):
            clock.t += 1.4  # a checkpoint (or a barrier) inside this gap, timed by the ledger
            held[0] += 1.4
        if k == STEPS + SETTLE + 15:
            clock.t += 3.0  # an evaluation: not timed
        cap.on_step()
        if poll_every_step:
            out += cap.poll()
    out += cap.poll()
    rec = out[0]
    assert rec["step_s_before"] == pytest.approx(0.1)
    after = [r["step_s_after"] for r in out if r["step_s_after"] is not None]
    assert after == [pytest.approx(0.1)]
    assert len(out) == (2 if poll_every_step else 1)  # polled each step: the record, then its follow-up


class FakeMemory:
    def __init__(self, calls, snapshot_raises=False):
        self.calls, self.snapshot_raises = calls, snapshot_raises
        self.snapshot = {"segments": [{"address": 1, "total_size": 2 << 20}], "device_traces": [[]]}

    def _record_memory_history(self, **kwargs):
        self.calls.append(("record", kwargs))

    def _snapshot(self):
        self.calls.append(("snapshot", {}))
        if self.snapshot_raises:
            raise RuntimeError("snapshot failed")
        return self.snapshot

    def _dump_snapshot(self, *a, **k):
        raise AssertionError("the training thread must not pickle")


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []
    memory = FakeMemory(calls)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setitem(sys.modules, "torch.cuda.memory", memory)
    monkeypatch.setattr(torch.profiler, "profile", lambda **k: pytest.fail("the profiler was used"))
    return memory, calls


def test_a_memory_snapshot_starts_and_stops_the_history_around_its_steps(tmp_path, fake_cuda):
    memory, calls = fake_cuda
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("memory") is None
    assert calls == []
    cap.on_step()
    assert calls == [("record", {"max_entries": 100_000})]
    for _ in range(STEPS - 1):
        cap.on_step()
        assert len(calls) == 1
    cap.on_step()
    assert calls == [("record", {"max_entries": 100_000}), ("snapshot", {}), ("record", {"enabled": None})]
    rec, = cap.poll()
    assert rec["error"] is None and rec["kind"] == "memory" and rec["steps"] == STEPS
    assert rec["path"].endswith("-memory.pickle") and stat.S_IMODE(os.lstat(rec["path"]).st_mode) == 0o600
    with open(rec["path"], "rb") as f:
        assert pickle.load(f) == memory.snapshot
    assert cap.request("memory") == "a capture is already running"
    for _ in range(SETTLE + AROUND):
        cap.on_step()
    assert [set(r) for r in cap.poll()] == [{"kind", "path", "step_s_after"}]
    assert cap.request("memory") == "one memory snapshot per 10 min"
    assert len(calls) == 3


def test_a_failed_memory_snapshot_still_stops_the_history(tmp_path, fake_cuda):
    memory, calls = fake_cuda
    memory.snapshot_raises = True
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("memory") is None
    for _ in range(STEPS + 3):
        cap.on_step()
    assert calls[-1] == ("record", {"enabled": None})
    rec, = cap.poll()
    assert rec["error"] == "RuntimeError: snapshot failed" and rec["path"] is None and rec["bytes"] is None
    assert not cap.busy and os.listdir(tmp_path / "c") == []


def test_a_profiler_that_raises_is_an_error_record_and_training_goes_on(tmp_path, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("Kineto is not available\nsecond line")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    clock = Clock()
    cap = Capturer(str(tmp_path / "c"), clock=clock)
    step = make_job()
    with hooked(cap):
        assert cap.request("trace") is None
        for _ in range(10):
            step()
        rec, = cap.poll()
        assert rec["error"] == "RuntimeError: Kineto is not available" and rec["path"] is None
        assert not cap.busy and cap.poll() == []
        # a profiler that breaks in the middle is stopped
        calls = []
        monkeypatch.setattr(torch.profiler, "profile", lambda **k: FakeProfile(calls, step_raises=True, **k))
        clock.t += probe_capture.RATE_S
        assert cap.request("trace") is None
        for _ in range(10):
            step()
    assert names(calls)[:3] == ["init", "start", "stop"]
    rec, = cap.poll()
    assert rec["error"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED" and rec["steps"] == STEPS
    assert os.listdir(tmp_path / "c") == []


def test_a_symlinked_or_foreign_directory_is_refused_without_raising(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    cap = Capturer(str(link))
    assert "is a symbolic link" in cap.error
    assert cap.request("trace") == f"no capture directory: {link} is a symbolic link"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert "is a symbolic link" in Capturer(str(dangling)).error and not (tmp_path / "nowhere").exists()
    (tmp_path / "file").write_text("")
    assert "is not a directory" in Capturer(str(tmp_path / "file")).error
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert "open to others" in Capturer(str(shared)).error
    assert "cannot be created" in Capturer(str(tmp_path / "no" / "such")).error
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        assert "belongs to another user" in Capturer(str(theirs)).error
    assert os.listdir(real) == []


def test_a_directory_swapped_for_a_symlink_is_not_written_into(tmp_path, fake_profile):
    d = tmp_path / "c"
    cap = Capturer(str(d))
    assert cap.request("trace") is None
    for _ in range(STEPS + 1):
        cap.on_step()
    elsewhere = tmp_path / "elsewhere"
    d.rename(elsewhere)
    d.symlink_to(elsewhere)
    rec, = cap.poll()
    assert rec["error"] == f"{d} is a symbolic link" and rec["path"] is None
    assert os.listdir(elsewhere) == []


def test_an_existing_file_is_never_overwritten(tmp_path, fake_profile, monkeypatch):
    monkeypatch.setattr(probe_capture, "_stamp", lambda t: "20260101-000000")
    d = tmp_path / "c"
    cap = Capturer(str(d))
    base = f"capture-{os.getpid()}-20260101-000000"
    (d / f"{base}.pt.trace.json.gz").write_text("keep")
    outside = tmp_path / "outside"
    (d / f"{base}-2.pt.trace.json.gz").symlink_to(outside)
    assert cap.request("trace") is None
    for _ in range(STEPS + 1):
        cap.on_step()
    rec, = cap.poll()
    assert rec["error"] is None and rec["path"] == str(d / f"{base}-3.pt.trace.json.gz")
    assert (d / f"{base}.pt.trace.json.gz").read_text() == "keep" and not outside.exists()
    assert sorted(os.listdir(d)) == sorted([f"{base}.pt.trace.json.gz", f"{base}-2.pt.trace.json.gz",
                                            f"{base}-3.pt.trace.json.gz"])


def test_a_trace_over_the_bound_is_deleted_and_reported(tmp_path, fake_profile, monkeypatch):
    monkeypatch.setitem(probe_capture.MAX_BYTES, "trace", 10)
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("trace") is None
    for _ in range(STEPS + 1):
        cap.on_step()
    rec, = cap.poll()
    assert rec["path"] is None and "over the" in rec["error"] and "deleted" in rec["error"]
    assert os.listdir(tmp_path / "c") == [] and not cap.busy


@pytest.mark.parametrize("cuda, user, expected", [(None, None, "1"), ("12.6", None, "1"), ("13.0", None, "1"),
                                                  ("12.4", None, None), ("11.8", None, None), ("12.8", "0", "0")])
def test_cupti_teardown_is_asked_for_where_it_is_safe(tmp_path, fake_profile, monkeypatch, cuda, user, expected):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    if user is not None:
        monkeypatch.setenv("TEARDOWN_CUPTI", user)
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("trace") is None
    assert os.environ.get("TEARDOWN_CUPTI") == user  # not before the profiler starts
    cap.on_step()
    assert os.environ.get("TEARDOWN_CUPTI") == expected


def test_close_stops_a_running_capture_and_writes_a_stopped_one(tmp_path, fake_profile):
    calls, _ = fake_profile
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("trace") is None
    cap.on_step()
    cap.on_step()
    cap.close()
    assert names(calls) == ["init", "start", "stop"]
    rec, = cap.poll()
    assert rec["error"] == f"the process ended during the capture (1 of {STEPS} steps)" and rec["path"] is None
    assert cap.request("trace") == "the probe is closing" and not cap.busy
    cap.on_step()
    cap.close()
    assert cap.poll() == []

    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("trace") is None
    for _ in range(STEPS + 1):
        cap.on_step()
    cap.close()
    rec, = cap.poll()
    assert rec["error"] is None and os.path.getsize(rec["path"]) == rec["bytes"]


def test_a_bad_request_is_refused_in_one_line(tmp_path):
    cap = Capturer(str(tmp_path / "c"))
    assert cap.request("trace", ["fast", "slow"]).startswith("ValueError: could not convert")
    assert not cap.busy and cap.request("trace") is None


def test_the_step_time_before_leaves_out_the_pause_that_started_the_capture():
    """A capture asked for by a pause starts at the first step after it: the pause is no step."""
    sync_every_10 = ([0.001] * 9 + [0.25]) * 4  # a job that waits for the GPU every 10 steps
    assert probe_capture._usual(sync_every_10) == sync_every_10  # its long gaps are its pace
    assert probe_capture._usual([0.05] * 39 + [4.0]) == [0.05] * 39  # a 4-s checkpoint before the capture


def test_the_profilers_own_start_and_stop_lines_stay_out_of_the_jobs_stderr(tmp_path, capfd, monkeypatch):
    """libkineto writes "USDT:... profiler_start" (and stop) on stderr as a trace starts and stops:
    in the job's own output and log. The capture drops those lines, and only those: what the job
    writes meanwhile still reaches its stderr."""
    import torch.profiler as profiler

    real = profiler.profile

    class JobWritesMeanwhile(real):
        def start(self):
            os.write(2, b"the job's own line\n")  # another thread of the job, in the window
            super().start()

    monkeypatch.setattr(profiler, "profile", JobWritesMeanwhile)
    cap = Capturer(str(tmp_path / "captures"))
    step = make_job()
    with hooked(cap):
        assert cap.request("trace", timed_steps(step, 5)) is None
        records = []
        for _ in range(STEPS + 2):
            step()
            records += cap.poll()
    assert len(records) == 1 and records[0]["error"] is None and os.path.exists(records[0]["path"])
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err and "profiler_stop" not in err, err
    assert "the job's own line" in err


def test_kineto_chatter_is_told_from_the_jobs_lines():
    chatter = probe_capture.KINETO_CHATTER
    assert chatter.match(b"USDT:2026-12-04 17:56:41 32295:32295 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
    assert chatter.match(b"STAGE:2024-01-02 03:04:05 1:2 ActivityProfilerController.cpp:314] Completed Stage: Warm Up\n")
    assert not chatter.match(b"ERROR:2026-12-04 17:56:41 1:1 CuptiActivityApi.cpp:10] CUPTI could not start\n")
    assert not chatter.match(b"USDT is a word the job may print\n")
    assert not chatter.match(b"step 500 loss 0.1\n")

"""Captures as an attacker sees them (docs/SECURITY.md, "Captures"): a job that sends capture records
nobody asked for, sparse or huge files, a flood on a small disk, and a `RUN.ttrec.captures/` folder
another user made first. Each test reproduces a break of the landed code."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time

import pytest

from traintop.record import evidence
from traintop.collectors.probe_client import ProbeClient, _Conn, capture_record
from traintop.collectors.simulated import Simulator
from traintop.errors import RecordingError
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.samples import Capture, Frame, SessionInfo

VICTIM, ATTACKER = 4201, 4202  # two users other than root (no passwd entry needed)
STAMP = "20261204-101010"


def _private(path: str, uid: int | None = None) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _capture_file(folder: str, pid: int, kind: str = "trace", size: int = 4096, stamp: str = STAMP) -> str:
    suffix = ".pt.trace.json.gz" if kind == "trace" else "-memory.pickle"
    path = os.path.join(folder, f"capture-{pid}-{stamp}{suffix}")
    with open(path, "wb") as f:
        f.write(os.urandom(size))  # not sparse, not compressible
    os.chmod(path, 0o600)
    return path


def _record(path: str, frames: int, captures_at: dict[int, tuple[Capture, ...]], gpus: int = 1):
    """A monitor recording ``frames`` simulated samples to ``path``, captures arriving with some."""
    sim = Simulator("starved", gpus=gpus, seed=2, interval=0.5)
    info = sim.info()
    monitor = Monitor(info, recorder=RecordingWriter(path, info))
    for i in range(frames):
        f = sim.next_frame()
        caps = captures_at.get(i, ())
        monitor.ingest(Frame(t=f.t, gpus=f.gpus, host=f.host, captures=caps) if caps else f, evaluate=False)
    return monitor


def _as_user(uid: int, fn, *args, timeout: float = 60.0):
    """``fn(*args)`` in a forked child running as ``uid`` (its JSON-able result, or the error it raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return into pytest
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"value": fn(*args)}
        except BaseException as e:  # noqa: BLE001 - said to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(w, json.dumps(out, default=str).encode())
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return json.loads(data)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")


# -- only on request ---------------------------------------------------------------------

def _client_with_probe(tmp_path, clock):
    a, b = socket.socketpair()
    a.setblocking(False)
    folder = _private(str(tmp_path / "probes"))
    client = ProbeClient(directory=folder, clock=clock)
    client._conns[77] = _Conn(77, a, os.getuid(), folder)
    return client, b, os.path.join(folder, "captures")


def _say(sock, *records, refused=None):
    msg = {"v": 1, "pid": 77, "steps": 5, "captures": list(records)}
    if refused:
        msg["capture_refused"] = refused
    sock.sendall(json.dumps(msg).encode() + b"\n")


def test_a_capture_record_nobody_asked_for_is_not_heard(tmp_path):
    """A job that sends capture records on its own (to have traintop copy its files beside the
    recording) is ignored and counted; a request's answer is taken once, for the kind asked."""
    now = [1000.0]
    client, probe, folder = _client_with_probe(tmp_path, lambda: now[0])
    trace = {"kind": "trace", "path": f"{folder}/capture-77-{STAMP}.pt.trace.json.gz", "steps": 3, "t": time.time()}
    _say(probe, trace, dict(trace, kind="memory", path=f"{folder}/capture-77-{STAMP}-memory.pickle"))
    client.sample({77})
    assert client.take_captures() == () and client.unasked_captures == 2

    assert client.request_capture("trace") == 1
    assert probe.recv(100) == b"capture trace\n"
    memory = dict(trace, kind="memory", path=f"{folder}/capture-77-{STAMP}-memory.pickle")
    _say(probe, memory, trace, trace)  # a kind not asked, the answer, the answer again
    client.sample({77})
    got = client.take_captures()
    assert [(c.kind, c.follow_up) for c in got] == [("trace", False)] and client.unasked_captures == 4
    # its one follow-up (the step time after) for that file, and no other
    after = {"kind": "trace", "path": trace["path"], "step_s_after": 0.1}
    _say(probe, dict(after, path=f"{folder}/capture-77-{STAMP}-2.pt.trace.json.gz"), after, after)
    client.sample({77})
    assert [(c.kind, c.follow_up) for c in client.take_captures()] == [("trace", True)]
    assert client.unasked_captures == 6


def test_an_answer_comes_in_its_time_or_not_at_all(tmp_path):
    from traintop.collectors.probe_client import CAPTURE_ANSWER_S

    now = [1000.0]
    client, probe, folder = _client_with_probe(tmp_path, lambda: now[0])
    rec = {"kind": "memory", "path": f"{folder}/capture-77-{STAMP}-memory.pickle", "steps": 3, "t": time.time()}
    client.request_capture("memory")
    now[0] += CAPTURE_ANSWER_S + 1
    _say(probe, rec)
    client.sample({77})
    assert client.take_captures() == () and client.unasked_captures == 1
    # a refusal ends the request: a record after it is not an answer (a refusal of no kind is nothing)
    client.request_capture("memory")
    _say(probe, refused=[{"kind": ["memory"]}, {"kind": {}}, "memory", {"kind": "memory", "why": "no CUDA here"}])
    client.sample({77})
    _say(probe, rec)
    client.sample({77})
    assert client.take_captures() == () and client.unasked_captures == 2


def test_a_compressed_trace_is_a_captures_name():
    folder = "/run/user/1000/traintop/captures"
    rec = {"kind": "trace", "path": f"{folder}/capture-42-{STAMP}.pt.trace.json.gz", "steps": 3}
    assert capture_record(rec, {}, 42, folder).path == rec["path"]
    # TensorBoard's profiler plugin lists "<worker>.pt.trace.json" and "<worker>.pt.trace.json.gz"
    assert rec["path"].endswith(".pt.trace.json.gz")
    for bad in (f"{folder}/capture-42-{STAMP}.pt.trace.json.gz.x", f"{folder}/capture-42-{STAMP}.gz"):
        assert capture_record(dict(rec, path=bad), {}, 42, folder) is None


# -- the copy: off the sampling path, sparse-aware, bounded ------------------------------------

def test_the_copy_never_holds_up_a_sample(tmp_path, monkeypatch):
    """The copy ran inside the sampler's tick: an 8-s recording kept 3 of 16 samples while a big file
    was copied. A copy that cannot go on (held here at its first read) must not stop the samples."""
    src = _capture_file(_private(str(tmp_path / "probe" / "captures")), 77, size=1 << 20)
    real, reading, gate = os.read, threading.Event(), threading.Event()

    def read(fd, n):
        try:
            held = os.readlink(f"/proc/self/fd/{fd}") == src
        except OSError:
            held = False
        if held:
            reading.set()
            gate.wait(30)
        return real(fd, n)

    monkeypatch.setattr(os, "read", read)
    rec = str(tmp_path / "run.ttrec")
    done: list[int] = []
    t = threading.Thread(target=_record_and_keep, args=(rec, src, done))
    t.start()
    try:
        assert reading.wait(20), "the copy never started"
        for _ in range(200):  # all 16 samples taken while the copy waits (a hang guard, not a speed bound)
            if done:
                break
            time.sleep(0.05)
        assert done and done[0] == 16, "samples stopped while a capture was copied"
    finally:
        gate.set()
        t.join(30)
    cap, = RecordingReader(rec).captures()
    assert cap.error is None and cap.path == os.path.join(rec + ".captures", os.path.basename(src))
    assert RecordingReader(rec).frame_count == 16


def _record_and_keep(rec: str, src: str, done: list) -> None:
    monitor = _record(rec, 16, {0: (Capture(t=time.time(), pid=77, kind="trace", path=src, steps=3),)})
    done.append(monitor.store.frames_seen)
    monitor.close()


def test_a_sparse_file_is_never_copied(tmp_path):
    """A sparse file claims hundreds of MB and holds none: it was copied in full."""
    folder = _private(str(tmp_path / "probe" / "captures"))
    src = os.path.join(folder, f"capture-77-{STAMP}-memory.pickle")
    with open(src, "wb") as f:
        f.truncate(200 << 20)
    rec = str(tmp_path / "run.ttrec")
    _record(rec, 8, {1: (Capture(t=time.time(), pid=77, kind="memory", path=src, steps=3),)}).close()
    cap, = RecordingReader(rec).captures()
    assert cap.error and "sparse" in cap.error and src in cap.error
    assert os.listdir(rec + ".captures") == []


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB file system of its own (tmpfs, as root); skipped where none can be mounted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs (a full disk cannot be made otherwise)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, timeout=30)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_a_flood_of_captures_never_costs_the_recording_a_sample(tmp_path, small_disk, monkeypatch):
    """Captures fill what they may of the recording's disk, never the room its samples need: a flood
    filled the disk and the recording lost its samples."""
    monkeypatch.setattr(evidence, "RESERVE_BYTES", 4 << 20, raising=False)
    folder = _private(str(tmp_path / "probe" / "captures"))
    caps = {i * 4: (Capture(t=time.time() + i, pid=100 + i, kind="trace", steps=3,
                            path=_capture_file(folder, 100 + i, size=1 << 20)),) for i in range(30)}
    rec = os.path.join(small_disk, "run.ttrec")
    monitor = _record(rec, 300, caps, gpus=8)
    monitor.close()
    assert monitor.recording_error is None
    assert RecordingReader(rec).frame_count == 300
    kept = RecordingReader(rec).captures()
    assert len(kept) == 30 and any(c.error is None for c in kept)
    refused = [c for c in kept if c.error]
    # the disk's reserve refuses some; with frames written as fast as they come the copier may also
    # fall behind, and the queue's bound refuses others (each says which)
    assert any("free on the recording's disk" in c.error for c in refused)
    assert all("free on the recording's disk" in c.error or "waiting to be copied" in c.error for c in refused)
    fs = os.statvfs(small_disk)
    assert fs.f_bavail * fs.f_frsize >= 2 << 20


def test_a_recording_that_could_not_be_finished_is_a_failure(small_disk):
    """The disk filled before the recording was closed: its samples stayed in RUN.ttrec-wal and the
    writer said nothing (`record` exited 0)."""
    sim = Simulator("starved", gpus=8, seed=1, interval=0.5)
    info = sim.info()
    path = os.path.join(small_disk, "run.ttrec")
    writer = RecordingWriter(path, info, chunk_frames=100, flush_every=1e9)
    monitor = Monitor(info, recorder=writer)
    for _ in range(100):
        monitor.ingest(sim.next_frame(), evaluate=False)
    writer.flush()
    fd = os.open(os.path.join(small_disk, "fill"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    monitor.close()
    assert monitor.recording_error and "-wal" in monitor.recording_error
    with pytest.raises(RecordingError):
        RecordingWriter(os.path.join(small_disk, "other.ttrec"), info).close()


# -- the folder's budget -------------------------------------------------------------------------

def test_the_captures_folder_is_held_to_its_budget_and_the_report_says_what_went(tmp_path, monkeypatch):
    from traintop.reports.analyze import analyze, render_text

    monkeypatch.setenv("TRAINTOP_CAPTURES_BUDGET_MB", "1")
    folder = _private(str(tmp_path / "probe" / "captures"))
    caps = {i * 3: (Capture(t=time.time() + i, pid=100 + i, kind="trace", steps=3, reason="Data starvation",
                            path=_capture_file(folder, 100 + i, size=400 << 10, stamp=f"20261204-10101{i}")),)
            for i in range(4)}
    rec = str(tmp_path / "run.ttrec")
    monitor = _record(rec, 16, caps)
    monitor.close()
    kept = os.listdir(rec + ".captures")
    assert sum(os.path.getsize(os.path.join(rec + ".captures", n)) for n in kept) <= 1 << 20
    rows = RecordingReader(rec).captures()
    removed = [c for c in rows if c.error]
    assert [c.pid for c in removed] == [100, 101] and sorted(kept) == sorted(os.path.basename(c.path) for c in rows
                                                                             if not c.error)
    assert all(c.error.startswith("removed to hold run.ttrec.captures to its budget of 1 MiB") for c in removed)
    text = render_text(analyze(RecordingReader(rec)))
    assert "removed to hold run.ttrec.captures to its budget of 1 MiB (oldest out first)" in text
    assert text.count("removed to hold") == 2
    # the run's end-of-job lines say it too
    from traintop.cli import findings_summary

    lines = findings_summary([], monitor.captures)
    assert sum("removed to hold" in line for line in lines) == 2


def test_the_probes_folder_keeps_one_jobs_share_then_the_oldest_go(tmp_path):
    from traintop.injob.capture import hold_budget

    folder = _private(str(tmp_path / "captures"))
    mine = [_capture_file(folder, 7, size=200 << 10, stamp=f"20261204-10100{i}") for i in range(3)]
    theirs = [_capture_file(folder, 8, size=300 << 10, stamp=f"20261204-10000{i}") for i in range(3)]
    for k, p in enumerate(theirs + mine):  # theirs are older
        os.utime(p, (1000 + k, 1000 + k))
    os.symlink("/etc/passwd", os.path.join(folder, f"capture-9-{STAMP}-memory.pickle"))
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("x" * (2 << 20))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        removed = hold_budget(fd, 1 << 20, os.path.basename(mine[-1]), own_pid=7)
    finally:
        os.close(fd)
    # its own beyond half the budget first (the oldest of them), then anyone's oldest beyond all of it
    assert removed == [os.path.basename(mine[0]), os.path.basename(theirs[0])]
    assert os.path.exists(mine[-1]) and os.path.islink(os.path.join(folder, f"capture-9-{STAMP}-memory.pickle"))
    assert os.path.exists(os.path.join(folder, "notes.txt"))


# -- a folder that is not ours -------------------------------------------------------------------

def _victim_records(shared: str, src: str) -> dict:
    rec = os.path.join(shared, "run.ttrec")
    info = SessionInfo(kind="live", interval=0.5)
    monitor = Monitor(info, recorder=RecordingWriter(rec, info))
    t = time.time()
    monitor.ingest(Frame(t=t, captures=(Capture(t=t, pid=77, kind="memory", path=src, steps=3),)), evaluate=False)
    for i in range(1, 4):
        monitor.ingest(Frame(t=t + i), evaluate=False)
    monitor.close()
    row, = RecordingReader(rec).captures()
    return {"row_error": row.error, "row_path": row.path}


def _victim_analyzes(rec: str) -> dict:
    from traintop.reports.analyze import analyze

    c, = analyze(RecordingReader(rec)).captures
    return {"path": c["path"], "error": c["error"], "line": c["line"]}


@needs_root
def test_a_captures_folder_another_user_made_first_is_refused(tmp_path):
    """Another user makes RUN.ttrec.captures/ (open to all) before the victim records there: the copy
    of the victim's memory snapshot went into it, she swapped the pickle, and `analyze` pointed to hers."""
    shared = tempfile.mkdtemp(prefix="tt-shared-")
    try:
        os.chmod(shared, 0o1777)  # as /tmp
        theirs = os.path.join(shared, "run.ttrec.captures")
        os.mkdir(theirs)
        os.chmod(theirs, 0o777)
        os.chown(theirs, ATTACKER, ATTACKER)
        probe = _private(os.path.join(shared, "victim-probe"), VICTIM)
        src = _capture_file(_private(os.path.join(probe, "captures"), VICTIM), 77, kind="memory")
        os.chown(src, VICTIM, VICTIM)

        got = _as_user(VICTIM, _victim_records, shared, src)
        assert "error" not in got, got
        assert "belongs to another user" in got["value"]["row_error"]
        assert os.listdir(theirs) == []  # nothing of the victim's went into her folder
        # she plants a pickle under the name a copy would have had: analyze never points to it
        planted = os.path.join(theirs, os.path.basename(src))
        with open(planted, "wb") as f:
            f.write(b"cos\nsystem\n(S'echo owned'\ntR.")
        os.chown(planted, ATTACKER, ATTACKER)
        seen = _as_user(VICTIM, _victim_analyzes, os.path.join(shared, "run.ttrec"))
        assert "error" not in seen, seen
        assert seen["value"]["path"] != planted and planted not in seen["value"]["line"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_analyze_points_only_to_a_copy_of_the_recordings_owner(tmp_path):
    """A recording whose row names a copy beside it: a folder of another owner, one others can write,
    or a symlink in place of the file is not pointed to (said in the line)."""
    from traintop.reports.analyze import analyze

    probe = _private(str(tmp_path / "probe" / "captures"))
    src = _capture_file(probe, 77, kind="memory")
    rec = str(tmp_path / "run.ttrec")
    info = SessionInfo(kind="live", interval=0.5)
    monitor = Monitor(info, recorder=RecordingWriter(rec, info))
    t = time.time()
    monitor.ingest(Frame(t=t, captures=(Capture(t=t, pid=77, kind="memory", path=src, steps=3),)), evaluate=False)
    monitor.ingest(Frame(t=t + 1), evaluate=False)
    monitor.close()
    beside = os.path.join(rec + ".captures", os.path.basename(src))
    assert analyze(RecordingReader(rec)).captures[0]["path"] == beside

    os.chmod(rec + ".captures", 0o777)
    c = analyze(RecordingReader(rec)).captures[0]
    assert c["error"] and "can be written by others" in c["error"] and c["path"] != beside
    os.chmod(rec + ".captures", 0o700)
    os.unlink(beside)
    os.symlink("/etc/passwd", beside)
    c = analyze(RecordingReader(rec)).captures[0]
    assert c["error"] and "not a plain file" in c["error"]


def test_a_folder_swapped_for_a_symlink_after_the_first_copy_is_not_written_through(tmp_path):
    """The folder is held open and checked before each copy: swapped for a link to elsewhere between
    two captures, the second is refused and nothing lands elsewhere."""
    probe = _private(str(tmp_path / "probe" / "captures"))
    keeper = evidence.Keeper(str(tmp_path / "run.ttrec"))
    first = keeper.copy(Capture(t=0.0, pid=1, kind="trace", path=_capture_file(probe, 1)))
    assert first.path.startswith(str(tmp_path / "run.ttrec.captures"))
    os.rename(tmp_path / "run.ttrec.captures", tmp_path / "moved")
    elsewhere = _private(str(tmp_path / "elsewhere"))
    os.symlink(elsewhere, tmp_path / "run.ttrec.captures")
    with pytest.raises(evidence.NotKept, match="was replaced"):
        keeper.copy(Capture(t=0.0, pid=2, kind="trace", path=_capture_file(probe, 2)))
    assert os.listdir(elsewhere) == []
    assert stat.S_IMODE(os.stat(tmp_path / "moved").st_mode) == 0o700

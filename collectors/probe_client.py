"""traintop's side of the probe channel: find the probes of the attached job, read them.

Connects to ``probe-<pid>.sock`` for every PID of the process tree (and each PID's
namespaced NSpid, for jobs in containers), checks that the peer runs as our user (or
root), and reads JSON lines without ever blocking. Survives probes appearing, vanishing
and restarting, and traintop itself restarting.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
import socket
import stat
import time

from traintop import plausible
from traintop.collectors.probe_limits import Allowance, ProbeGuard, ProbeLimits
from traintop.injob.agent import peer_pid, peer_uid, private_dir_problem, probe_dir
from traintop.injob.capture import CAPTURE_NAME  # noqa: F401  (the names a capture's file may have)
from traintop.samples import LEDGER_BUCKETS, MATMUL_MODES, backend_index, Capture, RankSample, StackDump, ThreadStack
from traintop.stats import median
from traintop.text import one_line

MAX_LINE = 1 << 20
MAX_THREADS = plausible.MAX_THREADS
MAX_STACK_CHARS = plausible.MAX_STACK_CHARS
MAX_STEP_TIMES = 10_000  # what the probe keeps between two messages
MAX_DEVICES = 64


# A capture's answer is taken only from the probe that was asked, for the kind asked, this long after
# the request: it covers a few steps (one of a slow job's takes minutes) and the file's writing.
CAPTURE_ANSWER_S = 900.0
RATE_S = 10.0  # the step rate is taken over this much
RATE_MIN_S = 2.0


def _count(v, bounds=(0, plausible.MAX_COUNT)) -> bool:
    return v is None or (type(v) is int and bounds[0] <= v <= bounds[1])


def _seconds(v) -> bool:
    return v is None or (type(v) in (int, float) and plausible.number(v, (0.0, 1e6)) is not None)


def _flag_ok(v) -> bool:
    return v is None or type(v) is bool


def _time_ok(v) -> bool:
    return v is None or plausible.time_ok(v)


def _when(v) -> float:
    """The time a probe gave (``v``), or now where it gave none that is plausible."""
    return float(v) if plausible.time_ok(v) else time.time()


def _counted(bounds):
    return lambda v: _count(v, bounds)


_MEMORY_FIELDS = ("allocated", "reserved", "peak", "active", "inactive_split")
_RANK = plausible.RANK
# A message's plain fields and what each must be (absent or null: unknown); one that is not drops
# the message. The structured ones (lists, objects, texts) are checked below them.
FIELDS = {
    "pid": _counted(plausible.PID), "ppid": _counted((0, plausible.PID[1])), "rank": _counted(_RANK["rank"]), "local_rank": _counted(_RANK["rank"]),
    "world_size": _counted(_RANK["world_size"]), "steps": _count, "skipped": _count, "drops": _count,
    "cuda": _flag_ok, "hooks": _flag_ok, "torch": _flag_ok, "loader": _flag_ok,
    "input_wait": _seconds, "window": _seconds, "t": _time_ok,
}
MEMORY_FIELDS = {"device": _counted(_RANK["device"]), **{k: _counted(_RANK[k]) for k in _MEMORY_FIELDS},
                 "alloc_retries": _count, "ooms": _count}
# read where they are used, each checked there: a bad one is left out, not the message
STRUCTURED = ("step_times", "ledger", "precision", "flops", "pause_stack", "memory", "stacks", "stacks_reason",
              "since_step", "captures", "job", "backend")


def parse_message(line: bytes) -> dict | None:
    """A probe message checked field by field (None: drop it). JSON's NaN and Infinity are
    refused, nesting is bounded, every number must be of its type and in its range, lists are
    bounded."""
    try:
        msg = plausible.json_doc(line, MAX_LINE)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("v") != 1 or type(msg.get("v")) is not int:
        return None
    if not all(ok(msg.get(k)) for k, ok in FIELDS.items()):
        return None
    times = msg.get("step_times")
    if times is not None and (not isinstance(times, list) or len(times) > MAX_STEP_TIMES
                              or not all(type(x) in (int, float) and _seconds(x) for x in times)):
        return None
    ledger = msg.get("ledger")
    if ledger is not None and (not isinstance(ledger, dict) or len(ledger) > len(LEDGER_BUCKETS)
                               or not all(k in LEDGER_BUCKETS and type(v) in (int, float) and _seconds(v)
                                          for k, v in ledger.items())):
        return None
    precision = msg.get("precision")
    if precision is not None and (not isinstance(precision, dict) or precision.get("matmul") not in MATMUL_MODES):
        msg["precision"] = None  # a reading we do not know: not the whole message
    flops = msg.get("flops")
    if flops is not None and (not isinstance(flops, dict)
                              or plausible.number(flops.get("flops"), plausible.RANK["step_flops"]) is None):
        msg["flops"] = None
    pause = msg.get("pause_stack")
    if pause is not None and not isinstance(pause, str):
        msg["pause_stack"] = None
    memory = msg.get("memory")
    if memory is not None:
        if not isinstance(memory, list) or len(memory) > MAX_DEVICES:
            return None
        for d in memory:
            if not isinstance(d, dict) or not all(ok(d.get(k)) for k, ok in MEMORY_FIELDS.items()):
                return None
    return msg


def _flag(v) -> bool | None:
    return v if isinstance(v, bool) else None  # the probe's word: a flag, or nothing


def _job(v) -> str | None:
    # the probe's word, so untrusted: one short line, printable
    return (one_line(v, limit=64) or None) if isinstance(v, str) else None


class StepRate:
    """A rank's steps a second over the last RATE_S: its step counter's rise over that much of
    our clock, and before there is RATE_MIN_S of it, the mean of the step periods received so far
    (the current gap counted once it is longer than their mean). Never one message's count: a
    starved job steps in bursts, and a message holds a burst or none (36 then 0.0 steps/s for a
    job making 18)."""

    __slots__ = ("counts", "periods", "seen")

    def __init__(self) -> None:
        self.counts: list[tuple[float, int]] = []  # (when, step counter) over the last RATE_S
        self.periods: collections.deque[float] = collections.deque()  # the latest step periods, RATE_S of them
        self.seen = 0.0

    def rate(self, now: float, steps: int | None, periods: list[float], since_step: float | None) -> float | None:
        self.seen = now
        self.periods.extend(periods)
        span = sum(self.periods)
        while len(self.periods) > 2 and span - self.periods[0] >= RATE_S:
            span -= self.periods.popleft()
        if steps is None:
            return None
        if self.counts and steps < self.counts[-1][1]:  # a new process under the PID: a new count
            self.counts.clear()
            self.periods.clear()
        self.counts.append((now, steps))
        while len(self.counts) > 2 and now - self.counts[1][0] >= RATE_S:
            del self.counts[0]
        t0, s0 = self.counts[0]
        if now - t0 >= RATE_MIN_S:
            return (steps - s0) / (now - t0)
        n = len(self.periods)
        if n == 0:
            return 0.0 if since_step is not None and since_step >= RATE_MIN_S else None
        total = sum(self.periods)
        if since_step is not None and since_step > total / n:
            total += since_step
        return n / total if total > 0 else None


class _Conn:
    def __init__(self, pid: int, sock: socket.socket, uid: int | None = None, directory: str = "",
                 slurm_job: str | None = None) -> None:
        self.pid = pid
        self.sock = sock
        self.directory = directory  # where its socket is: its captures can only be in directory/captures/
        self.uid = uid  # SO_PEERCRED: who runs the process behind the socket
        self.slurm_job = slurm_job  # the Slurm job this host vouches that process is in (collectors/whose.py)
        self.owner: int | None = None  # the directory owner whose connections count it (ProbeGuard)
        self.buf = bytearray()
        self.lines: Allowance | None = None  # messages it may still send (ProbeGuard's rate)
        self.bytes: Allowance | None = None
        self.last: dict | None = None
        self.last_seen = 0.0
        self.step_times: list[float] = []
        self.wait = 0.0
        self.window = 0.0
        self.ledger = dict.fromkeys(LEDGER_BUCKETS, 0.0)  # seconds in each bucket since the last sample
        self.fresh = False  # a message arrived since the last sample
        self.prev: RankSample | None = None
        self.asked: dict[str, float] = {}  # capture kind -> when this probe was asked for one
        self.awaited: dict[str, str] = {}  # capture kind -> the path whose step time after is still to come


def _vouched_job(sock: socket.socket, uid: int | None) -> str | None:
    """The Slurm job the host vouches the socket's process is in: found by the peer's PID and uid
    as the kernel gives them (a socket's name is its maker's word), its cgroup root's and of
    Slurm's shape. Looked up once per connection: a process does not leave its job."""
    pid = peer_pid(sock)
    if pid is None or uid is None:
        return None
    from traintop.collectors.whose import slurm_job_of

    return slurm_job_of(pid, uid)


def job_probe_dir(pid: int) -> str | None:
    """The probe directory a process was started with (TRAINTOP_PROBE_DIR in its environment):
    `traintop run` gives a job a directory of its own where the usual one is taken."""
    from traintop.collectors.procread import bounded, read_file

    env = bounded("environ", read_file, f"/proc/{pid}/environ", 1 << 20)  # another user's process may hold it up
    for item in (env or b"").split(b"\0"):
        if item.startswith(b"TRAINTOP_PROBE_DIR="):
            return os.fsdecode(item[len(b"TRAINTOP_PROBE_DIR="):]) or None
    return None


def _remove_if_dead(pid: int, path: str) -> None:
    """A probe socket nobody listens on, of a process that no longer exists (a job killed by a
    signal cannot remove its own), is removed — only from a directory of our own user."""
    if os.path.exists(f"/proc/{pid}"):
        return
    try:
        if os.lstat(os.path.dirname(path)).st_uid == os.geteuid() and stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


class ProbeClient:
    def __init__(self, directory: str | None = None, clock=time.monotonic, owner_uid: int | None = None,
                 guard: ProbeGuard | None = None, limits: ProbeLimits | None = None) -> None:
        self.directory = directory or probe_dir()
        # whose probes may answer: ours (or root's); an agent run as root reading another user's
        # directory accepts that directory's owner
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self._conns: dict[int, _Conn] = {}
        self._clock = clock
        self.rejected: set[int] = set()
        self._stacks: list[StackDump] = []  # received, not yet taken
        self._captures: list[Capture] = []  # received, not yet taken
        self.bad_messages = 0  # dropped: not JSON, or a field out of its type or range
        self.unasked_captures = 0  # capture records no request of ours called for: dropped
        self._job_dirs: dict[int, str | None] = {}
        # PID -> its step rate's history: kept across a reconnection (a reader the probe dropped
        # for falling behind connects again), which would otherwise start the rate afresh
        self._rates: dict[int, StepRate] = {}
        self.refused_dirs: dict[str, str] = {}  # directory -> why no probe there is read
        # what a probe is granted (connections, descriptors, messages a second): an agent's
        # clients share one guard; a client of its own starts the guard's tick itself
        self._own_guard = guard is None
        self.guard = guard if guard is not None else ProbeGuard(limits)
        self._retry: dict[int, tuple[float, float]] = {}  # pid -> (no connect before, the wait after a failure)
        self._refused_now: dict[int, str] = {}  # pid -> why it is not connected (counted once)
        self._turn = 0  # whose turn to be read first: the tick's budget reaches everyone in turn

    def _directories(self, pid: int) -> list[str]:
        if pid not in self._job_dirs:
            self._job_dirs[pid] = job_probe_dir(pid)
        job_dir = self._job_dirs[pid]
        dirs = [self.directory]
        if job_dir and job_dir != self.directory:
            dirs.append(job_dir)
        return dirs

    def _connect(self, pid: int, now: float) -> None:
        if self._retry.get(pid, (0.0, 0.0))[0] > now:
            return
        for d in self._directories(pid):
            # Only into a directory of ours that nobody else can write: connecting into another
            # user's would tell them which PID is watched.
            problem = private_dir_problem(d, owner=self.owner_uid if os.geteuid() == 0 else None)
            if problem:
                if os.path.lexists(d) and (d in self.refused_dirs or len(self.refused_dirs) < 64):
                    self.refused_dirs[d] = problem
                continue
            path = os.path.join(d, f"probe-{pid}.sock")
            if os.path.exists(path):
                why = self.guard.may_connect(self.owner_uid)
                if why is not None:
                    self._refuse(pid, why)
                else:
                    self._connect_to(pid, path, now)
                return

    def _connect_to(self, pid: int, path: str, now: float) -> None:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.guard.no_descriptors()
                self._refuse(pid, "descriptors")
            return
        try:
            # never waits: a socket whose queue another process keeps full answers EAGAIN at once
            s.setblocking(False)
            try:
                s.connect(path)
            except ConnectionRefusedError:
                _remove_if_dead(pid, path)
                raise
            uid = peer_uid(s)
            # in another user's directory, root takes only that user's sockets: a name swapped for a
            # link to a root service's socket between the scan and this connect reaches root's peer
            if uid not in (self.owner_uid, 0) or (uid == 0 != self.owner_uid and os.geteuid() == 0):
                self.rejected.add(pid)
                s.close()
                return
            job = _vouched_job(s, uid)
        except OSError:
            s.close()
            _, wait = self._retry.get(pid, (0.0, 0.5))
            self._retry[pid] = (now + min(2 * wait, 30.0), min(2 * wait, 30.0))  # 1 s, 2 s, ... 30 s
            return
        self._retry.pop(pid, None)
        self._refused_now.pop(pid, None)
        c = self._conns[pid] = _Conn(pid, s, uid, os.path.dirname(path), job)
        c.owner = self.owner_uid
        self.guard.opened(self.owner_uid)

    def connected(self) -> set[int]:
        return set(self._conns)

    def _refuse(self, pid: int, why: str) -> None:
        """A socket left unread past a bound: counted once while it stays so, said once."""
        if self._refused_now.get(pid) == why:
            return
        self._refused_now[pid] = why
        lim = self.guard.limits
        note = (f"traintop: the probes of uid {self.owner_uid} hold {lim.per_user} connections, the most one user "
                "may have: that user's further sockets are not read" if why == "per_user_limit" else
                "traintop: the agent is short of file descriptors (it keeps some for /metrics, NVML and files): "
                "probe sockets past them are not read; raise its open-file limit (LimitNOFILE=)")
        self.guard.refuse(why, note=note, key=self.owner_uid if why == "per_user_limit" else None)

    def _drop(self, pid: int) -> None:
        c = self._conns.pop(pid)
        c.sock.close()
        if c.owner is not None:
            self.guard.closed(c.owner)

    def _read(self, c: _Conn, now: float) -> bool:
        """Read what the probe's allowance and the tick's budget grant (the rest waits in its
        socket); False when the probe is gone or does not speak our protocol."""
        g = self.guard
        if c.lines is None or c.bytes is None:
            lim = g.limits
            c.lines = Allowance(lim.lines_per_s, lim.burst_lines, now)
            c.bytes = Allowance(lim.bytes_per_s, lim.burst_bytes, now)
        c.lines.refill(now)
        c.bytes.refill(now)
        want = min(int(c.bytes.left), g.tick_bytes())
        while want > 0:
            try:
                chunk = c.sock.recv(min(65536, want))
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not chunk:
                return False
            want -= len(chunk)
            c.bytes.left -= len(chunk)
            g.spend_bytes(len(chunk))
            c.buf += chunk
            self._take_lines(c)
            if len(c.buf) > MAX_LINE:
                return False  # a line longer than any message
        if c.bytes.left < 1:
            g.refuse("rate", note=f"traintop: a probe of uid {self.owner_uid} sends more than "
                     f"{g.limits.bytes_per_s / (1 << 20):g} MiB/s: what it sends past that is read no faster",
                     key=("bytes", self.owner_uid))
        return True

    def _take_lines(self, c: _Conn) -> None:
        """Take the complete lines in the buffer, as many as the probe's message rate grants;
        the others are dropped unread (counted)."""
        n = c.buf.count(b"\n")
        if not n:
            return
        assert c.lines is not None
        k = c.lines.take(n)
        *lines, rest = c.buf.split(b"\n", k)
        if k < n:
            rest = rest[rest.rfind(b"\n") + 1:]
            self.guard.refuse("rate", n - k, note=f"traintop: a probe of uid {self.owner_uid} sends more than "
                              f"{self.guard.limits.lines_per_s:g} messages a second: the others are dropped",
                              key=("lines", self.owner_uid))
        c.buf = rest
        for line in lines:
            self._accept_line(c, bytes(line))

    def _accept_line(self, c: _Conn, line: bytes) -> None:
        """Take one message, or drop it whole (counted) when any field is not what a probe sends:
        a bad line must never reach the sample, where it would stop every later tick."""
        msg = parse_message(line)
        if msg is None:
            self.bad_messages += 1
            return
        c.step_times.extend(float(x) for x in msg.get("step_times") or ())  # JSON's 0 is an int
        if len(c.step_times) > MAX_STEP_TIMES:
            del c.step_times[:-MAX_STEP_TIMES]
        c.wait += msg.get("input_wait") or 0.0
        c.window += msg.get("window") or 0.0
        for k, v in (msg.get("ledger") or {}).items():
            c.ledger[k] += v
        c.last = msg
        c.last_seen = self._clock()
        c.fresh = True
        self._take_capture_records(c, msg)
        if msg.get("pause_stack"):
            self._stacks.append(pause_dump(msg, c.pid))
            del self._stacks[:-64]
        if msg.get("stacks") is not None:
            dump = stack_dump(msg, c.pid)
            if dump is not None:
                self._stacks.append(dump)
                del self._stacks[:-64]  # nobody took them: keep the latest

    def _take_capture_records(self, c: _Conn, msg: dict) -> None:
        """A probe's capture records, each kept only as the answer to our own request: the kind this
        probe was asked for, within CAPTURE_ANSWER_S, once (then its one follow-up). A job that sends
        records nobody asked for (to have traintop copy files beside a recording) is not heard."""
        now = self._clock()
        for kind in [k for k, t in c.asked.items() if now - t > CAPTURE_ANSWER_S]:
            del c.asked[kind]
        refused = msg.get("capture_refused")
        for r in refused[:8] if isinstance(refused, list) else ():
            if isinstance(r, dict) and isinstance(r.get("kind"), str) and r["kind"] in c.asked:
                del c.asked[r["kind"]]  # the probe said no: no answer will come
        records = msg.get("captures")
        for rec in records[:8] if isinstance(records, list) else ():
            cap = capture_record(rec, msg, c.pid, os.path.join(c.directory, "captures"))
            if cap is None:
                continue
            if cap.follow_up:
                asked = cap.path is not None and c.awaited.get(cap.kind) == cap.path
                if asked:
                    del c.awaited[cap.kind]
            else:
                asked = c.asked.pop(cap.kind, None) is not None
                if asked and cap.path is not None and cap.error is None:
                    c.awaited[cap.kind] = cap.path
            if not asked:
                self.unasked_captures += 1
                continue
            self._captures.append(cap)
            del self._captures[:-32]

    def request_stacks(self) -> int:
        """Ask every connected probe for its threads' stacks; they arrive with its next message
        (``take_stacks``). Returns how many were asked."""
        asked = 0
        for c in self._conns.values():
            try:
                c.sock.send(b"stacks\n")
                asked += 1
            except OSError:  # gone or full: the next sample drops it
                pass
        return asked

    def request_capture(self, kind: str) -> int:
        """Ask every connected probe for a capture (``trace`` or ``memory``); the result comes with
        a later message (``take_captures``). Returns how many were asked."""
        asked = 0
        for c in self._conns.values():
            try:
                c.sock.send(f"capture {kind}\n".encode())
                c.asked[kind] = self._clock()
                asked += 1
            except OSError:
                pass
        return asked

    def take_captures(self) -> tuple[Capture, ...]:
        out, self._captures = tuple(self._captures), []
        return out

    def take_stacks(self) -> tuple[StackDump, ...]:
        out, self._stacks = tuple(self._stacks), []
        return out

    @property
    def bad_lines(self) -> int:  # the older name
        return self.bad_messages

    def sample(self, pids: set[int]) -> tuple[RankSample, ...]:
        if self._own_guard:
            self.guard.new_tick()
        for known in (self._job_dirs, self._retry, self._refused_now):
            for pid in [p for p in known if p not in pids]:
                del known[pid]
        self.rejected &= pids
        for pid in [p for p in self._conns if p not in pids]:  # its socket is gone: so is the connection
            self._drop(pid)
        now = self._clock()
        for pid in pids:
            if pid not in self._conns and pid not in self.rejected:
                self._connect(pid, now)
        out = []
        now = self._clock()
        for pid in [p for p, r in self._rates.items() if p not in self._conns and now - r.seen >= RATE_S]:
            del self._rates[pid]
        conns = list(self._conns.items())
        self._turn = (self._turn + 1) % max(1, len(conns))
        for pid, c in conns[self._turn:] + conns[:self._turn]:
            # past the tick's time for reading, a probe is read at its next turn; its last sample holds
            if self.guard.read_time_left() and not self._read(c, now):
                self._drop(pid)
                continue
            if c.last is None or self._helper(c):
                continue
            if c.fresh or c.prev is None:
                try:
                    c.prev = self._rank(c, now)
                except (ValueError, TypeError, OverflowError, ZeroDivisionError):
                    # parse_message should make this impossible; if not, lose this message, not the tick
                    self.bad_messages += 1
                    c.last, c.prev = None, None
                    c.step_times, c.wait, c.window, c.fresh = [], 0.0, 0.0, False
                    c.ledger = dict.fromkeys(LEDGER_BUCKETS, 0.0)
                    continue
                c.step_times, c.wait, c.window, c.fresh = [], 0.0, 0.0, False
                c.ledger = dict.fromkeys(LEDGER_BUCKETS, 0.0)
                out.append(c.prev)
            else:  # the probe publishes less often than we sample: its last rates still hold
                out.append(dataclasses.replace(c.prev, age=now - c.last_seen))
        return tuple(sorted(out, key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.pid)))

    def _helper(self, c: _Conn) -> bool:
        """A process another probed process started that has stepped no optimizer and holds no GPU
        memory: a compile worker, a loader worker started by spawn, an evaluation subprocess. It is no
        rank (mp.spawn's ranks become ones at their first step, or once they hold GPU memory)."""
        m = c.last
        assert m is not None  # sample() asks only of a connection that has a message
        if m.get("ppid") not in self._conns or m.get("steps"):
            return False
        return not any(isinstance(d, dict) and d.get("reserved") for d in m.get("memory") or ())

    @staticmethod
    def _int(v):
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def _rank(self, c: _Conn, now: float) -> RankSample:
        m = c.last
        assert m is not None  # sample() asks only of a connection that has a message
        precision, flops = m.get("precision"), m.get("flops")
        mem = [d for d in (m.get("memory") or []) if isinstance(d, dict)]
        main = max(mem, key=lambda d: d.get("reserved") or 0) if mem else {}
        i = self._int
        step_time = median(c.step_times) if c.step_times else None
        job = _job(m.get("job"))
        steps_per_s = self._rates.setdefault(c.pid, StepRate()).rate(
            now, i(m.get("steps")), c.step_times, plausible.number(m.get("since_step"), (0.0, 1e9)))
        return RankSample(
            pid=c.pid, rank=i(m.get("rank")), world_size=i(m.get("world_size")), device=i(main.get("device")),
            cuda=bool(m.get("cuda")), allocated=i(main.get("allocated")), reserved=i(main.get("reserved")),
            peak=i(main.get("peak")), active=i(main.get("active")), inactive_split=i(main.get("inactive_split")),
            alloc_retries=i(main.get("alloc_retries")), ooms=i(main.get("ooms")), steps=i(m.get("steps")),
            skipped_steps=i(m.get("skipped")),
            step_time=plausible.number(step_time, plausible.RANK["step_time"]),
            steps_per_s=plausible.number(steps_per_s, plausible.RANK["steps_per_s"]),
            # no DataLoader iterator entered yet: a wait of 0 would measure nothing (and rule out starvation)
            input_wait=min(1.0, c.wait / c.window) if c.window > 0 and m.get("loader") is not False else None,
            age=max(0.0, now - c.last_seen), local_rank=i(m.get("local_rank")), job=job, uid=c.uid,
            job_uid=c.uid if job is not None and job == c.slurm_job else None,
            torch=_flag(m.get("torch")), loader=_flag(m.get("loader")),
            matmul=MATMUL_MODES.index(precision["matmul"]) if precision else None,
            step_flops=float(flops["flops"]) if flops else None, backend=backend_index(m.get("backend")),
            **self._shares(c, m),
        )

    @staticmethod
    def _shares(c: _Conn, m: dict) -> dict:
        """The ledger's buckets as shares of the window (a probe without a ledger: none known). They add
        up to less than 1 while a pause is held back (no step yet, not overdue), and to more when a
        later message settles it: never cut, or that time would be lost from the rank's ledger."""
        if m.get("ledger") is None or c.window <= 0:
            return {}
        return {"time_" + b: min(plausible.LEDGER_SETTLE_MAX, c.ledger[b] / c.window) for b in LEDGER_BUCKETS}

    def close(self) -> None:
        for pid in list(self._conns):
            self._drop(pid)


def stack_dump(msg: dict, pid: int) -> StackDump | None:
    """A probe message's ``stacks`` as a StackDump; None when malformed (it is outside input)."""
    raw = msg.get("stacks")
    if not isinstance(raw, list):
        return None
    threads = []
    for d in raw[:MAX_THREADS]:
        if not isinstance(d, dict) or not isinstance(d.get("stack"), str):
            continue
        name = d.get("thread")
        threads.append(ThreadStack(name=name[:plausible.MAX_NAME] if isinstance(name, str) else "?",
                                   main=d.get("main") is True, stack=d["stack"][-MAX_STACK_CHARS:]))
    reason = "stalled" if msg.get("stacks_reason") == "stalled" else "requested"
    return _dump(msg, pid, reason, tuple(threads))


def capture_record(rec, msg: dict, pid: int, folder: str) -> Capture | None:
    """A probe's capture record, checked field by field (None: not one). Its file must be a plain
    name in the probe's own captures folder: a probe is another process's word, and traintop copies
    that file beside its recording."""
    if not isinstance(rec, dict) or rec.get("kind") not in ("trace", "memory"):
        return None
    path = rec.get("path")
    if path is not None and (not isinstance(path, str) or len(path) > 4096 or "\x00" in path
                             or os.path.dirname(path) != folder or not CAPTURE_NAME.fullmatch(os.path.basename(path))):
        return None
    def secs(v):
        return float(v) if type(v) in (int, float) and plausible.number(v, (0.0, 1e5)) is not None else None
    t, rank, size, steps, error = rec.get("t"), msg.get("rank"), rec.get("bytes"), rec.get("steps"), rec.get("error")
    removed = rec.get("removed")
    removed = tuple(n for n in removed[:16] if isinstance(n, str) and CAPTURE_NAME.fullmatch(n)) \
        if isinstance(removed, list) else ()
    return Capture(
        t=_when(t), pid=pid,
        kind=rec["kind"], rank=rank if type(rank) is int else None, path=path,
        size=size if type(size) is int and 0 <= size < 1 << 40 else None,
        steps=steps if type(steps) is int and 0 <= steps < 1000 else None,
        step_s_before=secs(rec.get("step_s_before")), step_s_after=secs(rec.get("step_s_after")),
        error=one_line(error, limit=200) if isinstance(error, str) else None,
        follow_up="steps" not in rec, removed=removed)


def pause_dump(msg: dict, pid: int) -> StackDump:
    """The training thread's stack the probe took in a pause (a step overdue, for no reason it knows)."""
    return _dump(msg, pid, "pause", (ThreadStack(name="training thread", main=True,
                                                 stack=msg["pause_stack"][-MAX_STACK_CHARS:]),))


def _dump(msg: dict, pid: int, reason: str, threads: tuple[ThreadStack, ...]) -> StackDump:
    t, since, rank = msg.get("t"), msg.get("since_step"), msg.get("rank")
    return StackDump(
        t=_when(t), pid=pid,
        rank=rank if type(rank) is int and _count(rank, _RANK["rank"]) else None, reason=reason,
        since_step=float(s) if (s := plausible.number(since, _RANK["step_time"])) is not None else None,
        threads=threads)

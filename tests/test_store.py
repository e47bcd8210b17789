import math

from traintop.samples import Frame, GpuSample, HostSample
from traintop.store import Store, linear_fit


def frame(t, util=None, mem=None, host=True):
    return Frame(t=t, gpus=(GpuSample(index=0, util=util, mem_used=mem),),
                 host=HostSample(cpu_percent=10.0) if host else None)


def test_ring_keeps_only_capacity_and_order():
    s = Store(capacity=5)
    for k in range(12):
        s.add(frame(float(k), util=float(k)))
    assert len(s) == 5
    assert s.window("gpu0.util") == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert s.times() == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert s.last("gpu0.util", 2) == [10.0, 11.0]
    assert s.latest_value("gpu0.util") == 11.0


def test_missing_values_are_none_not_zero():
    s = Store(capacity=10)
    s.add(frame(0.0, util=None))
    s.add(frame(1.0, util=50.0))
    assert s.window("gpu0.util") == [None, 50.0]
    assert s.window_pairs("gpu0.util") == [(1.0, 50.0)]


def test_series_absent_from_a_frame_reads_none():
    s = Store(capacity=10)
    s.add(frame(0.0, util=1.0, host=True))
    s.add(frame(1.0, util=2.0, host=False))
    assert s.window("host.cpu_percent") == [10.0, None]


def test_time_window_selects_by_sample_time():
    s = Store(capacity=100)
    for k in range(50):
        s.add(frame(k * 0.5, util=float(k)))
    w = s.window("gpu0.util", seconds=2.0)
    assert w == [45.0, 46.0, 47.0, 48.0, 49.0]


def test_memory_is_bounded_over_a_long_run():
    s = Store(capacity=50)
    for k in range(20_000):
        s.add(frame(float(k), util=1.0))
    assert len(s) == 50
    assert len(s._times) == 50


def test_linear_fit():
    slope, intercept, r2 = linear_fit([(t, 3.0 * t + 2.0) for t in range(10)])
    assert math.isclose(slope, 3.0) and math.isclose(intercept, 2.0) and math.isclose(r2, 1.0)
    assert linear_fit([(1.0, 1.0), (1.0, 2.0)]) is None


def test_first_time_is_when_any_of_the_series_first_has_a_value_in_the_window():
    s = Store(capacity=8)  # the ring wraps: the first values are gone
    for k in range(12):
        s.add(Frame(t=float(k), gpus=(GpuSample(index=0, util=float(k) if k >= 9 else None,
                                                mem_used=k if k >= 7 else None),)))
    assert s.first_time(["gpu0.util", "gpu0.mem_used"]) == 7.0
    assert s.first_time(["gpu0.util", "gpu0.mem_used"], seconds=3.5) == 8.0
    assert s.first_time(["gpu0.util"], seconds=10) == 9.0
    assert s.first_time(["gpu0.power_w"]) is None  # a series never seen


def test_what_a_reader_derives_is_kept_until_the_store_changes():
    s = Store(capacity=10)
    s.add(frame(0.0, util=10.0))
    worked = []

    def mean_util():
        worked.append(1)
        values = s.present("gpu0.util")
        return sum(values) / len(values)

    assert s.memo("mean", mean_util) == 10.0
    assert s.memo("mean", mean_util) == 10.0 and len(worked) == 1
    s.add(frame(1.0, util=30.0))  # a new sample: worked out again, from it
    assert s.memo("mean", mean_util) == 20.0 and len(worked) == 2
    s.extend([frame(2.0, util=50.0)])
    assert s.memo("mean", mean_util) == 30.0
    s.extend_series([3.0], [("gpu0.util", [70.0])], frame(3.0, util=70.0))
    assert s.memo("mean", mean_util) == 40.0 and len(worked) == 4

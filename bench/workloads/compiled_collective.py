"""Does the probe's wrapping of torch.distributed's collectives change a compiled or eager job?

One rank (nccl on a GPU, gloo on the CPU): a torch.compile'd function that all-reduces inside the
graph, compiled without the probe and again with it (graph breaks and the result must not change),
then the cost of one eager all-reduce with and without the wrapper (paired blocks, median).
Prints one JSON line. Usage: python3 bench/workloads/compiled_collective.py [--cpu]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def compiled_run(dev: str) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    g = torch.compile(f, backend="aot_eager")
    x = torch.ones(8, device=dev)
    out = g(x)
    return {"ok": bool(torch.equal(out.cpu(), torch.full((8,), 3.0))),
            "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}


def per_call_us(dev: str, n: int = 2000) -> float:
    x = torch.ones(1, device=dev)
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    if dev == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main() -> int:
    cpu = "--cpu" in sys.argv or not torch.cuda.is_available()
    dev = "cpu" if cpu else "cuda"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo" if cpu else "nccl", rank=0, world_size=1)
    out: dict = {"device": torch.cuda.get_device_name() if not cpu else "cpu", "torch": torch.__version__}
    out["without_probe"] = compiled_run(dev)
    plain = [per_call_us(dev) for _ in range(3)]
    from traintop.injob.agent import Probe, _dist_backend

    p = Probe(interval=0.1)
    assert p.start()
    # the probe wraps on its first ticks, from its own thread; the training thread is this one
    p.goodput.train_thread = __import__("threading").get_ident()
    end = time.time() + 10
    while not getattr(dist.all_reduce, "__traintop_probe__", False) and time.time() < end:
        time.sleep(0.05)
    out["wrapped"] = bool(getattr(dist.all_reduce, "__traintop_probe__", False))
    out["backend"] = _dist_backend()
    out["with_probe"] = compiled_run(dev)
    pairs = []
    for _ in range(7):
        wrapped = per_call_us(dev)
        p.goodput.uninstall()
        unwrapped = per_call_us(dev)
        p.goodput._patched.discard("torch.distributed")
        p.goodput.install()
        pairs.append((wrapped, unwrapped))
    out["per_call_us"] = {"wrapped_median": statistics.median(w for w, _ in pairs),
                          "unwrapped_median": statistics.median(u for _, u in pairs),
                          "added_median": statistics.median(w - u for w, u in pairs), "first_plain": plain}
    out["collective_seconds"] = p.goodput.totals.get("collective")
    p.stop()
    dist.destroy_process_group()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`traintop doctor`: the practitioner's preflight, each line pass / warn / fail with the fix.

1. Visibility: does NVML see the GPUs (names, driver, memory in use, processes)?
2. Stack: does the torch build's CUDA runtime suit the driver?
3. A small win: is torch.cuda.is_available(), and does a tiny model's forward and
   backward pass run on cuda?
Plus other processes holding GPU memory, and persistence mode. torch is probed in a
subprocess (``--python`` picks the training environment's interpreter), so a broken
install cannot take traintop down, and traintop itself never needs torch.
Nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, replace

from traintop.plausible import MAX_GPUS
from traintop.text import plain
from traintop.units import fmt_bytes

PASS, WARN, FAIL, INFO = "pass", "warn", "fail", "info"

TORCH_PROBE = r"""
import json, time
out = {}
try:
    import torch
except Exception as e:
    missing = isinstance(e, ModuleNotFoundError) and e.name == "torch"
    print(json.dumps({"error": f"{type(e).__name__}: {e}", "missing": missing})); raise SystemExit
out["torch"] = torch.__version__
out["cuda_runtime"] = torch.version.cuda
out["available"] = bool(torch.cuda.is_available())
if out["available"]:
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out["bf16"] = bool(torch.cuda.is_bf16_supported())
    try:
        t = time.perf_counter()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
        x = torch.randn(32, 64, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        torch.cuda.synchronize()
        out["step_ms"] = (time.perf_counter() - t) * 1000
        out["param_device"] = str(next(model.parameters()).device)
    except Exception as e:
        out["step_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
print(json.dumps(out))
"""


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _ver(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(text).split(".")[:2])
    except (TypeError, ValueError):
        return None


def _health_checks(col) -> list[Check]:
    """PCIe link, memory errors and what traintop can measure beyond nvidia-smi (GPM, XID events)."""
    col.poll_slow()  # link, ECC and remapped rows (no window needed)
    samples = col.sample()
    out = []
    links, slow_links = [], []
    for info, s in zip(col.infos, samples):
        if s.pcie_gen is None or info.pcie_gen_max is None:
            continue
        links.append(f"GPU {s.index} Gen{s.pcie_gen} x{s.pcie_width} (max Gen{info.pcie_gen_max} "
                     f"x{info.pcie_width_max})")
        if s.pcie_width is not None and info.pcie_width_max and s.pcie_width < info.pcie_width_max:
            slow_links.append(s.index)
    if links:
        if slow_links:
            out.append(Check("PCIe link", WARN, "; ".join(links),
                             "A link narrower than the GPU's maximum halves host-to-device bandwidth or worse: "
                             "check the slot, riser and BIOS settings (the generation may drop at idle; "
                             "the width should not)."))
        else:
            out.append(Check("PCIe link", PASS, "; ".join(links) + " (the generation drops while idle)"))
    unc = [(s.index, s.ecc_uncorrected) for s in samples if s.ecc_uncorrected]
    pending = [s.index for s in samples if s.remap_pending]
    known = [s for s in samples if s.ecc_uncorrected is not None]
    if unc or pending:
        detail = "; ".join([f"GPU {i}: {n} uncorrectable ECC error(s) since the driver loaded" for i, n in unc]
                           + [f"GPU {i}: a memory row remap is pending" for i in pending])
        out.append(Check("Memory errors (ECC)", FAIL, detail,
                         "Tell the operator: the GPU needs a reset (pending remap) or service; do not start "
                         "a long job on it."))
    elif known:
        corr = sum(s.ecc_corrected or 0 for s in known)
        out.append(Check("Memory errors (ECC)", PASS, f"no uncorrectable errors; {corr} corrected since the driver loaded"))
    gpm = [i for i, ok in enumerate(col.gpm.supported) if ok]
    if gpm:
        out.append(Check("GPM metrics", PASS, f"SM, tensor and DRAM activity readable on GPU {', '.join(map(str, gpm))}"))
    else:
        out.append(Check("GPM metrics", INFO, "not available (needs a Hopper-class GPU or newer and a recent "
                                             "driver): SM activity is not measured, utilization is a point sample"))
    out.append(_process_util_check(col))
    out.append(_mig_nvlink_check(col))
    out.append(Check("XID events", PASS if col.events.available else INFO,
                     "the driver delivers XID and ECC events to traintop" if col.events.available
                     else "event registration not permitted here: XIDs show only in the driver log (dmesg)"))
    return out


def _mig_nvlink_check(col) -> Check:
    """MIG mode and MIG devices per GPU, and its active NVLinks (read once at start)."""
    parts = []
    for i in col.infos:
        if i.parent is not None:
            continue
        mig = f"MIG on, {col.mig.counts.get(i.index, 0)} MIG device(s)" if i.mig \
            else "MIG off" if i.mig is False else "no MIG"
        links = f"{i.nvlinks} NVLink(s) active" if i.nvlinks is not None else "no NVLink"
        parts.append(f"GPU {i.index}: {mig}, {links}")
    detail = "; ".join(parts)
    if col.mig.dropped:
        detail += f"; {col.mig.dropped} MIG device(s) past row {MAX_GPUS - 1} are not shown"
    if col.mig.devices or any(i.nvlinks for i in col.infos):
        detail += (" (traintop's MIG and NVLink reading has not yet run on such a machine: compare with "
                   "`nvidia-smi -L` and `nvidia-smi nvlink -s`)")
    return Check("MIG and NVLink", INFO, detail)


def _process_util_check(col) -> Check:
    """Which NVML call gives each process's share of the GPU (asked twice: the first read primes)."""
    reader = col.process_util
    for _ in range(2):
        for i in range(len(col.handles)):
            reader.poll(i)
    calls = sorted({c for c in reader.calls if c})
    if calls:
        return Check("Per-process utilization", PASS, f"{' and '.join(calls)} answers")
    return Check("Per-process utilization", INFO, "neither NVML per-process call answers here: "
                 "each process's memory is shown, not its share of the GPU's time")


def nvml_checks(nvml=None) -> tuple[list[Check], str | None]:
    """Visibility, other processes, persistence. Returns the checks and the driver's CUDA version."""
    from traintop.collectors.nvml import NvmlCollector
    from traintop.errors import NoGpuError

    try:
        col = NvmlCollector(nvml)
    except NoGpuError as e:
        return [Check("GPU visible to NVML", FAIL, str(e),
                      "Check `nvidia-smi`; install or load the NVIDIA driver; in a container, start it with "
                      "GPU access (--gpus all / the NVIDIA container toolkit).")], None
    checks = []
    try:
        samples = col.sample()
        names = ", ".join(f"{i.index}: {i.name}" for i in col.infos)
        mem = "; ".join(f"GPU {s.index} {fmt_bytes(s.mem_used)} of {fmt_bytes(s.mem_total)} in use"
                        for s in samples)
        checks.append(Check("GPU visible to NVML", PASS,
                            f"{len(col.infos)} GPU(s) [{names}], driver {col.driver}, CUDA {col.cuda_driver}; {mem}"))
        procs = [(s.index, p) for s in samples for p in s.processes]
        if procs:
            listed = "; ".join(f"GPU {i}: PID {p.pid} holds {fmt_bytes(p.used_bytes)}" for i, p in procs)
            checks.append(Check("Other processes on the GPUs", WARN, listed,
                                "Make sure these are yours and meant to run: they take memory and time from the job."))
        else:
            checks.append(Check("Other processes on the GPUs", PASS, "none"))
        nv = col.nv
        modes = []
        for i, h in enumerate(col.handles):
            mode = col._safe(i, "persistence", nv.nvmlDeviceGetPersistenceMode, h) \
                if hasattr(nv, "nvmlDeviceGetPersistenceMode") else None
            modes.append(mode)
        if any(m == 0 for m in modes):
            off = [str(i) for i, m in enumerate(modes) if m == 0]
            checks.append(Check("Persistence mode", WARN, f"off on GPU {', '.join(off)}",
                                "An administrator can enable it (nvidia-smi -pm 1) so the driver stays loaded "
                                "between jobs; traintop never changes it."))
        elif any(m == 1 for m in modes):
            checks.append(Check("Persistence mode", PASS, "on"))
        checks.extend(_health_checks(col))
        return checks, col.cuda_driver
    finally:
        col.close()


OWN_PYTHON_HAS_NO_TORCH = ("no PyTorch in traintop's own Python (it never needs it): `traintop doctor --python "
                           "/path/to/your/env/bin/python` checks your training environment")


def torch_checks(python: str, driver_cuda: str | None, timeout: float = 180.0, own: bool = False) -> list[Check]:
    """``own``: ``python`` is traintop's own interpreter (no --python given), where torch may well be absent."""
    problem = python_problem(python)
    if problem is not None:
        return [Check("PyTorch", FAIL, problem, "Give --python the training environment's python "
                      "(e.g. /path/to/env/bin/python).")]
    try:
        r = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, TRAINTOP_PROBE_DISABLE="1"))
    except FileNotFoundError:
        return [Check("PyTorch", FAIL, f"no Python at {python}", "Give --python the training environment's python.")]
    except OSError as e:  # a directory, a file that is not executable or not a program
        return [Check("PyTorch", FAIL, f"cannot run {python}: {e.strerror or e}",
                      "Give --python the training environment's python.")]
    except subprocess.TimeoutExpired:
        return [Check("PyTorch", FAIL, f"importing torch and one step took over {timeout:.0f} s",
                      "A hung CUDA initialisation often means a driver problem: check `nvidia-smi` and dmesg.")]
    line = (r.stdout.strip().splitlines() or [""])[-1]
    try:
        info = json.loads(line)
    except json.JSONDecodeError:
        err = (r.stderr.strip().splitlines() or [""])[-1]
        if "Traceback (most recent call last)" in r.stderr:  # Python ran, and died importing torch
            return [Check("PyTorch", FAIL, f"the probe crashed: {err}", "Reinstall torch in that environment.")]
        said = f", saying: {err}" if err else ", no output"
        return [Check("PyTorch", FAIL, f"{python} did not run as Python (exit {r.returncode}{said})",
                      "Give --python the training environment's python (e.g. /path/to/env/bin/python).")]
    return interpret_torch(info, driver_cuda, python, own=own)


def interpret_torch(info: dict, driver_cuda: str | None, python: str = "python", own: bool = False) -> list[Check]:
    if "error" in info and own and info.get("missing"):
        # traintop is often installed apart from the training environment (scripts/traintop's
        # venv never has torch): that is no failure; a torch that is there and broken is.
        return [Check("PyTorch", INFO, OWN_PYTHON_HAS_NO_TORCH)]
    if "error" in info:
        return [Check("PyTorch", FAIL, f"{python}: {info['error']}",
                      "Install torch in the training environment, or point --python at it.")]
    checks = [Check("PyTorch", PASS, f"torch {info['torch']} (CUDA runtime {info.get('cuda_runtime') or 'none'})")]
    rt = _ver(info.get("cuda_runtime"))
    drv = _ver(driver_cuda)
    if rt is None:
        checks.append(Check("CUDA build", FAIL, "this torch is a CPU-only build",
                            "Install a CUDA build of torch (pip install torch from the CUDA index matching your driver)."))
    elif drv is not None and rt[0] > drv[0]:
        checks.append(Check("CUDA build vs driver", FAIL,
                            f"torch needs CUDA {info['cuda_runtime']}, the driver supports up to {driver_cuda}",
                            f"Upgrade the driver, or install torch built for CUDA {drv[0]}.x or older."))
    elif drv is not None and rt > drv:
        checks.append(Check("CUDA build vs driver", WARN,
                            f"torch built for CUDA {info['cuda_runtime']}, driver supports {driver_cuda}",
                            "Minor-version compatibility usually holds; if kernels fail to load, upgrade the driver."))
    elif drv is not None:
        checks.append(Check("CUDA build vs driver", PASS,
                            f"torch's CUDA {info['cuda_runtime']} ≤ the driver's {driver_cuda}"))
    if not info.get("available"):
        checks.append(Check("torch.cuda.is_available()", FAIL, "False: the job would train on the CPU",
                            "Check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES, and that torch is a CUDA build."))
        return checks
    checks.append(Check("torch.cuda.is_available()", PASS, f"True: {', '.join(info.get('devices', []))}"))
    if "step_error" in info:
        checks.append(Check("Forward and backward on cuda", FAIL, info["step_error"],
                            "An 'illegal memory access' or 'no kernel image' points at a driver/torch mismatch."))
    else:
        checks.append(Check("Forward and backward on cuda", PASS,
                            f"a small model ran on {info.get('param_device')} in {info.get('step_ms', 0):.0f} ms "
                            "(first call: includes CUDA start-up)"))
    if info.get("bf16") is not None:
        checks.append(Check("bf16", PASS if info["bf16"] else INFO,
                            "supported: mixed precision in bf16 saves memory and time" if info["bf16"]
                            else "not supported on this GPU: use fp16 with a gradient scaler"))
    return checks


def python_problem(python: str) -> str | None:
    """Why ``python`` cannot be the interpreter to check (one line), or None."""
    if not os.path.exists(python):
        return f"no Python at {python}"
    if os.path.isdir(python):
        return f"{python} is a directory, not a Python interpreter"
    if not os.access(python, os.X_OK):
        return f"{python} is not executable, so not a Python interpreter"
    return None


def in_own_venv(prefix: str | None = None) -> bool:
    """traintop runs from the .venv that scripts/traintop or scripts/test made (they leave a
    marker in it): never a training environment, though the tests put a CPU-only torch there."""
    prefix = prefix or sys.prefix
    return any(os.path.exists(os.path.join(prefix, f".traintop-{kind}")) for kind in ("runtime", "test"))


OWN_VENV_NOTE = ("traintop's own .venv (the tests' CPU-only torch), not a training environment: "
                 "`traintop doctor --python /path/to/your/env/bin/python` checks yours")


def run(python: str | None = None, nvml=None, config_error: str | None = None) -> list[Check]:
    checks, driver_cuda = nvml_checks(nvml)
    torch = torch_checks(python or sys.executable, driver_cuda, own=python is None)
    if python is None and in_own_venv():  # what its torch can do says nothing about the user's jobs
        said, judged = False, []
        for c in torch:
            if c.status in (FAIL, WARN):
                c = replace(c, status=INFO, detail=c.detail if said else f"{c.detail} — {OWN_VENV_NOTE}")
                said = True
            judged.append(c)
        torch = judged
    checks += torch
    if config_error:  # every other command refuses to start with it; doctor says what to fix
        checks.append(Check("config", FAIL, config_error,
                            "fix the file, or move it away to use the default thresholds"))
    return checks


def render(checks: list[Check]) -> str:
    mark = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL", INFO: "INFO"}
    out = []
    for c in checks:
        out.append(f"{mark[c.status]:<5} {c.name}: {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            out.append(f"      fix: {c.fix}")
    # details quote nvidia-smi, the driver and the training environment: shown, never acted on
    return plain("\n".join(out))


def to_json(checks: list[Check]) -> str:
    return json.dumps([asdict(c) for c in checks], indent=1)

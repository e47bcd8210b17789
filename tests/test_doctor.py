"""traintop doctor: each check's verdict and fix, with a fake NVML and real subprocesses."""

import subprocess
import sys

import pytest

from traintop.reports import doctor


def statuses(checks):
    return {c.name: c.status for c in checks}


def test_visible_gpu_other_processes_and_persistence(fake_nvml):
    nv, _ = fake_nvml(n=2)
    nv.nvmlDeviceGetPersistenceMode = lambda h: 0
    checks, cuda = doctor.nvml_checks(nv)
    s = statuses(checks)
    assert s["GPU visible to NVML"] == "pass" and cuda == "13.0"
    assert s["Other processes on the GPUs"] == "warn"  # PID 42 holds 1 GiB on each
    assert s["Persistence mode"] == "warn"
    assert "NVIDIA H200" in checks[0].detail and "580.159.04" in checks[0].detail


def test_no_gpu_is_one_fail_with_the_fix(fake_nvml):
    nv, _ = fake_nvml(init_error=9)
    checks, cuda = doctor.nvml_checks(nv)
    assert [c.status for c in checks] == ["fail"] and cuda is None and "driver" in checks[0].fix


@pytest.mark.parametrize("runtime,driver,verdict", [("13.0", "13.0", "pass"), ("12.8", "13.0", "pass"),
                                                    ("13.2", "13.0", "warn"), ("13.0", "12.4", "fail")])
def test_cuda_build_vs_driver(runtime, driver, verdict):
    info = {"torch": "2.11.0", "cuda_runtime": runtime, "available": True, "devices": ["NVIDIA H200"],
            "bf16": True, "step_ms": 800.0, "param_device": "cuda:0"}
    s = statuses(doctor.interpret_torch(info, driver))
    assert s["CUDA build vs driver"] == verdict
    assert s["Forward and backward on cuda"] == "pass"


def test_step_failure_and_missing_torch():
    info = {"torch": "2.11.0", "cuda_runtime": "13.0", "available": True, "devices": ["x"],
            "step_error": "RuntimeError: CUDA error: no kernel image is available"}
    s = statuses(doctor.interpret_torch(info, "13.0"))
    assert s["Forward and backward on cuda"] == "fail"
    s = statuses(doctor.interpret_torch({"error": "ModuleNotFoundError: No module named 'torch'"}, None))
    assert s == {"PyTorch": "fail"}


def test_missing_torch_in_traintops_own_python_is_only_info():
    missing = {"error": "ModuleNotFoundError: No module named 'torch'", "missing": True}
    (c,) = doctor.interpret_torch(missing, None, own=True)
    assert c.status == "info" and "--python" in c.detail and "never needs it" in c.detail
    # named with --python, the training environment must have it
    assert statuses(doctor.interpret_torch(missing, None, own=False)) == {"PyTorch": "fail"}
    # there but broken: a failure wherever it is
    broken = {"error": "ImportError: libcudart.so.13: cannot open shared object file", "missing": False}
    assert statuses(doctor.interpret_torch(broken, None, own=True)) == {"PyTorch": "fail"}


@pytest.fixture
def python_without_torch(tmp_path):
    """A Python where `import torch` fails as it does where torch is not installed."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"import sys; sys.modules['torch'] = None; "
                    f"exec(sys.argv[1])\" \"$2\"\n")
    path.chmod(0o755)
    return str(path)


def test_doctor_without_python_passes_where_its_own_python_has_no_torch(fake_nvml, monkeypatch,
                                                                       python_without_torch):
    nv, _ = fake_nvml(n=1)
    monkeypatch.setattr(doctor.sys, "executable", python_without_torch)
    checks = doctor.run(None, nvml=nv)
    assert statuses(checks)["PyTorch"] == "info"
    assert not [c for c in checks if c.status == "fail"]
    checks = doctor.run(python_without_torch, nvml=nv)  # --python: the training environment's
    assert statuses(checks)["PyTorch"] == "fail"


def test_real_torch_probe_in_a_subprocess():
    pytest.importorskip("torch")
    checks = doctor.torch_checks(sys.executable, None)
    s = statuses(checks)
    assert s["PyTorch"] == "pass"
    import torch
    if not torch.cuda.is_available():
        assert s["torch.cuda.is_available()"] == "fail"


def test_cli_exit_code_and_json():
    r = subprocess.run([sys.executable, "-m", "traintop", "doctor", "--json", "--python", "/nonexistent/python"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert '"status": "fail"' in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("python, reason", [
    ("/etc/passwd", "is not executable"), ("/etc", "is a directory"), ("/bin/false", "did not run as Python"),
    ("/nonexistent/python", "no Python at")])
def test_a_python_that_is_not_one_is_one_fail_with_the_right_reason(python, reason):
    r = subprocess.run([sys.executable, "-m", "traintop", "doctor", "--python", python],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("FAIL  PyTorch")]
    assert len(lines) == 1 and reason in lines[0], r.stdout
    assert "Reinstall torch" not in r.stdout


def test_traintops_own_venv_is_judged_as_information(fake_nvml, monkeypatch, tmp_path):
    nv, _ = fake_nvml(n=1)
    cpu_torch = [doctor.Check("PyTorch", "pass", "torch 2.13.0+cpu (CUDA runtime none)"),
                 doctor.Check("CUDA build", "fail", "this torch is a CPU-only build", "Install a CUDA build")]
    monkeypatch.setattr(doctor, "torch_checks", lambda *a, **k: list(cpu_torch))
    monkeypatch.setattr(doctor.sys, "prefix", str(tmp_path))
    assert statuses(doctor.run(None, nvml=nv))["CUDA build"] == "fail"  # any other Python: a failure
    (tmp_path / ".traintop-test").write_text("x\n")  # the marker scripts/test leaves in its .venv
    checks = doctor.run(None, nvml=nv)
    assert statuses(checks)["CUDA build"] == "info" and "traintop's own .venv" in doctor.render(checks)
    assert statuses(doctor.run("/usr/bin/python3", nvml=nv))["CUDA build"] == "fail"  # --python: the user's


def test_health_lines_pcie_ecc_gpm_and_events(fake_nvml, with_hopper_extras):
    nv, calls = fake_nvml(n=1)
    checks, _ = doctor.nvml_checks(with_hopper_extras(nv, calls))
    by = {c.name: c for c in checks}
    assert by["PCIe link"].status == "pass" and "Gen5 x16 (max Gen5 x16)" in by["PCIe link"].detail
    assert by["Memory errors (ECC)"].status == "pass" and "7 corrected" in by["Memory errors (ECC)"].detail
    assert by["GPM metrics"].status == "pass" and by["XID events"].status == "pass"
    nv, calls = fake_nvml(n=1)
    with_hopper_extras(nv, calls, gpm=False)
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 8
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 2
    nv.nvmlDeviceGetRemappedRows = lambda h: (0, 1, 1, 0)
    by = {c.name: c for c in doctor.nvml_checks(nv)[0]}
    assert by["PCIe link"].status == "warn" and "x8" in by["PCIe link"].detail
    assert by["Memory errors (ECC)"].status == "fail" and "remap is pending" in by["Memory errors (ECC)"].detail
    assert by["GPM metrics"].status == "info"

"""`traintop run -- CMD`: start a training command with the probe injected (no code change)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from importlib import resources

from traintop import __version__
from traintop.errors import TraintopError
from traintop.probe_agent import ensure_private_dir, probe_dir


def injection_dir() -> str:
    """A private directory holding sitecustomize.py and the standalone probe agent."""
    base = ensure_private_dir(probe_dir())
    d = os.path.join(base, f"inject-{__version__}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    pkg = resources.files("traintop")
    for src, dst in (("probe_agent.py", "_traintop_probe_agent.py"), ("inject/sitecustomize.py", "sitecustomize.py")):
        with resources.as_file(pkg.joinpath(src)) as path:
            tmp = os.path.join(d, dst + ".tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, os.path.join(d, dst))
    return d


def probe_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    d = injection_dir()
    env["PYTHONPATH"] = d + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TRAINTOP_PROBE_DIR", probe_dir())
    return env


def launch(cmd: list[str], log_path: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` with the probe; its output goes to a log file (the terminal is the dashboard's)."""
    if not cmd:
        raise TraintopError("traintop run needs a command: traintop run -- python train.py")
    if log_path is None:
        logs = os.path.join(ensure_private_dir(probe_dir()), "logs")
        os.makedirs(logs, mode=0o700, exist_ok=True)
        log_path = os.path.join(logs, time.strftime("run-%Y%m%d-%H%M%S.log"))
    try:
        log = open(log_path, "ab")
    except OSError as e:
        raise TraintopError(f"cannot write the job's log {log_path}: {e.strerror}") from None
    try:
        proc = subprocess.Popen(cmd, env=probe_env(), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except FileNotFoundError:
        raise TraintopError(f"command not found: {cmd[0]}") from None
    except PermissionError:
        raise TraintopError(f"not executable: {cmd[0]}") from None
    finally:
        log.close()
    return proc, log_path

"""Put on PYTHONPATH by `traintop run`: starts the probe in every Python process of the job.

Then hands over to any sitecustomize that was there before ours.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    if os.environ.get("TRAINTOP_PROBE_DISABLE") != "1":
        import _traintop_probe_agent

        _traintop_probe_agent.start()
except Exception as _e:  # the job must run whatever happens here
    print(f"traintop probe: not started ({_e})", file=sys.stderr)

# Chain to the next sitecustomize on the path, if any.
_ours = sys.modules.pop("sitecustomize", None)
_saved = list(sys.path)
try:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    import sitecustomize  # noqa: F401
except ImportError as _e:
    # As site.py does: no other sitecustomize is fine; an ImportError raised inside the
    # user's own is theirs to see (Python prints "Error in sitecustomize ..." for it).
    if _e.name != "sitecustomize":
        raise
finally:
    sys.path[:] = _saved
    if "sitecustomize" not in sys.modules and _ours is not None:
        sys.modules["sitecustomize"] = _ours

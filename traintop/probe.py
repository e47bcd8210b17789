"""``import traintop.probe`` in a training script starts traintop's probe (see probe_agent)."""

import os as _os

from traintop.injob.agent import start

if _os.environ.get("TRAINTOP_PROBE_DISABLE") != "1":
    start()

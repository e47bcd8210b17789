"""The in-job probe: what runs inside the user's training processes (docs/PROBE.md).

``agent`` (the socket server, the optimizer and DataLoader hooks), ``goodput`` (the time ledger)
and ``capture`` (profiler traces and memory snapshots). They import the standard library, torch
(the job's own) and each other, nothing else of traintop: ``traintop run`` copies them next to the
job as ``_traintop_probe_*.py``, where traintop may not be installed. Importing this package starts
nothing; ``import traintop.probe`` (traintop/probe.py) does.
"""

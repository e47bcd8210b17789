"""Where frames come from, besides the collectors: ``live`` (one Frame a tick from the live
collectors), ``importers`` and ``import_pmon`` (logs of nvidia-smi), ``log_source`` (a log read whole,
offered as a recording is). They import the base modules (traintop/*.py) and each other only.
"""

"""What traintop says about a session: ``view`` and ``status_text`` (what the dashboard shows, as
plain data), ``waste`` (the one GPU-hours formula), ``time_ledger``, ``analyze`` and
``analyze_parallel`` (the report of a whole run), ``export_commands`` (``snapshot`` and ``export``)
and ``doctor``. Above the session; never imports the cluster wing, the command line or the drawing.
"""

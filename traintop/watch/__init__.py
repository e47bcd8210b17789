"""A session of watching: ``monitor`` (frames in, store and alerts updated, recording written),
``feeds`` and ``replay_controls`` (what drives a monitor), ``session`` and ``sessions`` (one Session
for every front end, and how each is built), ``hooks`` (``--on-finding``), ``config`` (the user's
thresholds), ``launch`` and ``job`` (the job ``traintop run`` starts). Above the sources, the
recording and the rules; below the reports and the cluster wing, which it never imports.
"""

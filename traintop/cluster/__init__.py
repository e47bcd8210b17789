"""traintop over many hosts, through Prometheus: the agent's series, and the readers of them.

traintop builds no transport of its own: a node's agent serves ``/metrics`` (or writes a
file for node_exporter's textfile collector), Prometheus stores and joins, and
``analyze --prometheus`` reads Prometheus's HTTP API. No Textual here.
"""

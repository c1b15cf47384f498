"""The node-local XID watcher (`autoheal watch`): the kernel log -> Alertmanager, in well under a
second, and still when the GPU has fallen off the bus and its metrics are gone.

It sits beside the runner above the core: it imports `autoheal` only. One process per GPU node
(a DaemonSet in a cluster, one per simulated node in the lab): source (sources.py) -> driver lines
(autoheal.xid_messages) -> alerts with the rules' labels (alerts.py) -> a deduplicating,
rate-limited outbox (outbox.py) -> Alertmanager's v2 API (alertmanager.py), with its cursor and
undelivered alerts kept on disk (state.py) and its health as metrics (metrics.py).
See docs/operations.md ("The XID watcher").
"""

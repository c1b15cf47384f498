"""The HTTP server the lab's own daemons (the GPU simulator, the pool controller, the
notification sink) serve with.

http.server's ThreadingHTTPServer listens with a backlog of 5 (socketserver's default). In a storm
the pool controller posts a batch's reboots to the simulator 16 at a time while Prometheus
scrapes it, and connections beyond the backlog were reset: one node's reset error then failed a
whole batch of 100 (measured, bench/storm.py). A burst must queue, not be refused.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer

BACKLOG = 256


class LabHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose bursts of connections queue, with daemon handler threads."""

    request_queue_size = BACKLOG
    daemon_threads = True

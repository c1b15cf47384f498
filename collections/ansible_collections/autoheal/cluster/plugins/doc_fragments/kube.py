# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Options every autoheal.cluster Kubernetes module shares (module_utils/kube.py KUBE_COMMON_ARGS)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Absolute path to a kubeconfig; default in-cluster config, then C(KUBECONFIG), then C(~/.kube/config).
      - A relative path is refused - the module does not run in the directory the play was started from.
    type: path
  context:
    description: Kubeconfig context.
    type: str
  workers:
    description:
      - Concurrent API requests (a batch's nodes are read and patched side by side; a small batch
        uses one per node).
      - A storm's cordons wait on the API server's round trips, not its CPU; on the lab, 1,990
        nodes took 23.2 s with 16, 16.6 s with 48 and 15.9 s with 96 (bench/storm.py --all-fail).
        The API server's priority and fairness queues whatever a client sends past its share.
    type: int
    default: 64
  request_timeout:
    description: Seconds per API request.
    type: float
    default: 20
  api_wait:
    description:
      - Seconds to keep retrying, with a growing pause (0.5 s doubling to 4 s), a request the API server
        did not answer (connection refused or reset, timed out) or answered 502, 503 or 504 - an API
        server restarting, being upgraded or failing over. Then the task fails, naming this option.
      - Any other answer (403, 404, 409, 422, a PodDisruptionBudget's 429) is never retried here.
      - 0 fails at the first unanswered request.
    type: float
    default: 60
requirements:
  - kubernetes (Python), only for kubeconfigs with exec plugins or auth providers
"""

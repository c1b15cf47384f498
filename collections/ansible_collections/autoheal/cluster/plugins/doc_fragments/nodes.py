# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The batch of nodes every autoheal.cluster module acts on (module_utils/validate.py checks it)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  nodes:
    description:
      - The batch of node names (the same name in Slurm and Kubernetes), handled in one call.
      - >-
        Each must match the Kubernetes/Slurm node name grammar (lower-case letters, digits, C(-)
        and C(.), at most 253 characters); anything else fails the task before anything runs.
        Repeats are dropped.
    type: list
    elements: str
    required: true
"""

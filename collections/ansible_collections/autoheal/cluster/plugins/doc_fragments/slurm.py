# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Options every autoheal.cluster Slurm module shares (module_utils/slurm.py SLURM_COMMON_ARGS)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  slurm_conf:
    description:
      - Absolute path to slurm.conf (exported as C(SLURM_CONF)); default is Slurm's own.
      - A relative path is refused - the module does not run in the directory the play was started from.
    type: path
  bin_dir:
    description:
      - Directory holding the Slurm commands (C(sinfo), C(squeue), C(scontrol)); default is the C(PATH).
    type: path
  timeout:
    description: Seconds allowed per Slurm command (run under C(timeout) when it is on the C(PATH)).
    type: int
    default: 30
  controller_wait:
    description:
      - Seconds to keep retrying a Slurm command whose client could not reach slurmctld at all
        (C(Unable to contact slurm controller)), so that a controller that restarts or fails over
        within this time delays the step instead of failing it.
      - The pause between tries grows from 0.5 s to 4 s. A command that reached the controller is
        never retried. V(0) fails at once.
    type: int
    default: 60
"""

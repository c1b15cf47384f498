# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Options every autoheal.cluster Slurm module shares (module_utils/slurm.py SLURM_COMMON_ARGS)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  slurm_conf:
    description: Path to slurm.conf (exported as C(SLURM_CONF)).
    type: path
  bin_dir:
    description: Directory holding the Slurm commands (C(sinfo), C(squeue), C(scontrol)); default is the C(PATH).
    type: path
  timeout:
    description: Seconds allowed per Slurm command.
    type: int
    default: 30
"""

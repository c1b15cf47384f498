"""Where Slurm keeps things inside its pods, and its ports: one place for every builder."""

from __future__ import annotations

STATE_DIR = "/var/spool/slurmctld"  # slurmctld's StateSaveLocation: on a PersistentVolumeClaim
SPOOL_DIR = "/var/spool/slurm"
LOG_DIR = "/var/log/slurm"
RUN_DIR = "/run/slurm"
CONFIG_DIR = "/etc/slurm"
HOST_KEY_DIR = "/etc/ssh/autoheal-hostkey"
AUTHORIZED_KEYS_DIR = "/etc/ssh/autoheal"
MUNGE_SOCKET_DIR = "/run/munge"
MUNGE_KEY_DIR = "/etc/munge-secret"  # the Secret volume (symlinks munged refuses)
MUNGE_DIR = "/etc/munge"  # the copy munged reads: owned by munge, 0700/0400
CONTROLLER_PORT = 6817
SLURMD_PORT = 6818
SSH_PORT = 22
DEFAULT_IMAGE = "ghcr.io/autoheal/slurm:24.11"

"""The one definition of every Kubernetes label, taint, annotation and resource name autoheal uses.

The runbook only touches what autoheal itself set (an administrator's cordon or taint is left
alone), so these keys are part of the contract between the runner, the plays, the Pulumi
components and the lab. Everything Python imports them from here; the Ansible collection carries
a generated copy (`module_utils/contract.py`) and the roles' defaults repeat them as YAML, and
tests keep both in step with this file.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "autoheal.io"

# --- labels ----------------------------------------------------------------------------------
POOL_LABEL: Final = f"{DOMAIN}/pool"  # which GpuNodePool a node belongs to
SPARE_LABEL: Final = f"{DOMAIN}/spare"  # "true" on a hot spare until it is promoted
STATE_LABEL: Final = f"{DOMAIN}/state"  # "quarantined" once the runbook fenced the node
QUARANTINED: Final = "quarantined"  # the value of STATE_LABEL the fence sets
SPARE_STATE: Final = "spare"  # STATE_LABEL of a hot spare the spare keeper chose (remediation/spares.py)
ACTIVE_STATE: Final = "active"  # STATE_LABEL of a pool member in service (the keeper, a promotion)
OPT_OUT_LABEL: Final = f"{DOMAIN}/opt-out"  # on a node or a pod: fence only, no drain/replace
GPU_MODEL_LABEL: Final = f"{DOMAIN}/gpu-model"
ALERTMANAGER_CONFIG_LABEL: Final = f"{DOMAIN}/alertmanager-config"
# on the nodes of the stack's own system node group (EKS): where slurmctld, login and the runner run
ROLE_LABEL: Final = f"{DOMAIN}/role"
SYSTEM_ROLE: Final = "system"  # ROLE_LABEL's value on system nodes (never drained by the runbook)

# --- taints ----------------------------------------------------------------------------------
QUARANTINE_TAINT_KEY: Final = f"{DOMAIN}/quarantine"  # NoSchedule: PDBs and grace periods still rule
SPARE_TAINT_KEY: Final = SPARE_LABEL  # spares carry label and taint of the same key

# --- annotations -----------------------------------------------------------------------------
INCIDENT_ANNOTATION: Final = f"{DOMAIN}/incident"  # the incident that fenced the node
CORDONED_BY_ANNOTATION: Final = f"{DOMAIN}/cordoned-by"
REPLACES_ANNOTATION: Final = f"{DOMAIN}/replaces"  # on a promoted spare: the node it stands in for
VALIDATION_ANNOTATION: Final = f"{DOMAIN}/validation"  # the recovery ladder's last validation: passed|failed
POLICY_WAIVER_ANNOTATION: Final = f"{DOMAIN}/policy-waiver"
REMEDIATION_ANNOTATION: Final = f"{DOMAIN}/remediation"
STATE_DIR_ANNOTATION: Final = f"{DOMAIN}/state-dir"
TOKEN_SECRET_ANNOTATION: Final = f"{DOMAIN}/token-secret"
# On a device plugin's DaemonSet: the extended resource its pods advertise on the nodes they run on
# (lab.schedulable gives a node that resource only where such a pod was scheduled).
ADVERTISES_ANNOTATION: Final = f"{DOMAIN}/advertises"
# On the Jobs autoheal.cluster.node_job runs on a node (GPU reset, diagnostics, evidence): what for,
# which node (a label value: cut and hashed past 63 characters), and the hash of node + incident
# that ends the Job's name; the whole node name and the incident as annotations.
JOB_PURPOSE_LABEL: Final = f"{DOMAIN}/job-purpose"
JOB_NODE_LABEL: Final = f"{DOMAIN}/job-node"
JOB_KEY_LABEL: Final = f"{DOMAIN}/job-key"
NODE_ANNOTATION: Final = f"{DOMAIN}/node"
# On a node while the recovery ladder resets or validates its GPUs: "stopped". The GPU agents'
# DaemonSets (dcgm-exporter, slurmd) exclude it in their node affinity, so their pods leave the
# node and come back once the label is lifted (roles/ladder/tasks/holders.yml).
GPU_AGENTS_LABEL: Final = f"{DOMAIN}/gpu-agents"
GPU_AGENTS_STOPPED: Final = "stopped"
# On a Slurm node lent to inference (remediation/lending.py): lending (drained in Slurm, its jobs
# ending), lent (slurmd gone: the slurmd DaemonSet excludes lent and returning in its node
# affinity), returning (cordoned, inference pods evicted); no label: training. The annotation holds
# when the node last moved (Unix seconds; the cooldown counts from it).
LEND_LABEL: Final = f"{DOMAIN}/lend"
LEND_LENDING: Final = "lending"
LEND_LENT: Final = "lent"
LEND_RETURNING: Final = "returning"
LEND_MOVED_ANNOTATION: Final = f"{DOMAIN}/lend-moved-at"
# On a workload (Deployment, StatefulSet, Job...) or its namespace: who owns it, told when the
# runbook evicts its pods from a failing node (an inference service on a lent node): free text,
# e.g. "email:serving@example.org" or "slack:#serving" (the notification carries it as it is).
OWNER_CONTACT_ANNOTATION: Final = f"{DOMAIN}/owner-contact"

# --- the objects the Pulumi components declare (the policy pack and the review read them) ------
# Kubernetes' recommended labels, on every object of ours; COMPONENT_LABEL tells the policy pack
# which object is a pool description, the Slurm controller or the remediation runner.
NAME_LABEL: Final = "app.kubernetes.io/name"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
NODE_POOL_COMPONENT: Final = "node-pool"  # a GpuNodePool's description (ConfigMap)
SLURMCTLD_COMPONENT: Final = "slurmctld"  # the Slurm controller (StatefulSet)
RUNNER_COMPONENT: Final = "remediation-runner"  # the runner's Deployment, Service, RBAC
CONFIG_HASH_ANNOTATION: Final = f"{DOMAIN}/config-hash"  # on pod templates: a config change rolls them

# --- GPUs --------------------------------------------------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"  # extended resource; also the taint key of GPU pools
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"

# --- Slurm -----------------------------------------------------------------------------------
REASON_PREFIX: Final = "autoheal:"  # every Slurm reason autoheal sets starts with this
SPARE_REASON: Final = "autoheal: hot spare"
# a new node registered drained until the spare keeper decides spare or active (a cloud's bridge)
JOINING_REASON: Final = "autoheal: joining"
# a node drained while its slurmd pod is restarted onto a new pod template (playbooks/slurm_rollout.yml)
ROLLOUT_REASON: Final = "autoheal: config rollout"
# a node drained for lending to inference (remediation/lending.py); resumed when it comes back
LEND_REASON: Final = "autoheal: lent to inference"
# the comment a promoted spare carries: "<this><failed node> <incident>" (slurm_spares)
PROMOTION_PREFIX: Final = "autoheal: replaces "


def spare_taint() -> dict[str, str]:
    """The taint a hot spare carries until promotion (a fresh dict: callers mutate manifests)."""
    return {"key": SPARE_TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def quarantine_taint(tier: str) -> dict[str, str]:
    """The taint the fence adds (its value: the action tier): NoSchedule, not NoExecute, so the
    eviction that follows honours PDBs and grace periods."""
    return {"key": QUARANTINE_TAINT_KEY, "value": tier, "effect": "NoSchedule"}


def gpu_taint() -> dict[str, str]:
    """The taint GPU pools carry so that only GPU workloads land there."""
    return {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

"""`pulumi up` of the lab stack against a running lab, with the real engine, offline.

The stack is the repository's own (`Pulumi.yaml`, `__main__.py`, `components/`); only the stack
config is per lab: a copy of `Pulumi.lab.yaml` whose kubeconfig points at this lab, passed with
`--config-file`, and a file backend inside the lab's run directory, so labs never share state.

A lab with real nodes runs what it declares: the images are the ones `autoheal images build` made
for it, by digest; SlurmCluster is awaited (its volumes come from the lab's provisioner), the
login Service is a NodePort reachable from this host, and the lab's own ssh key (ssh_key()) is
the declared authorized key. slurmctld, login and the runner are pinned to real nodes (a pod
on a KWOK node never runs, and real slurmds could not reach a controller there; in a pods lab,
to its system node, away from the GPU nodes the runbook drains), the XID watchers run the lab's
runner image, and no dcgm-exporter is declared: the lab's GPU simulator serves the DCGM metrics.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from autoheal.errors import LabError
from autoheal.paths import data_root
from lab.config import LabConfig

REPO = data_root()
STACK = "lab"


def available() -> bool:
    try:
        from lab.pulumi_env import pulumi_bin, pulumi_env  # noqa: F401

        pulumi_bin()
    except Exception:
        return False
    return (REPO / "Pulumi.yaml").exists() and (REPO / "Pulumi.lab.yaml").exists()


def ssh_key(cfg: LabConfig) -> Path:
    """The lab's ssh key for the login node (private; `.pub` beside it), made once per lab."""
    key = cfg.run_dir / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"autoheal-lab-{cfg.name}", "-f", str(key)],
            check=True,
            capture_output=True,
        )
    return key


def built_images(cfg: LabConfig) -> dict[str, str]:
    """name -> reference by digest of the images this lab's real nodes run (none without them)."""
    from lab.nodes import cluster

    if not cfg.real_nodes or not cluster.enabled(cfg.run_dir):
        return {}
    return {img.name: img.ref for img in cluster.context(cfg.run_dir).images}


def _real_node_config(cfg: LabConfig, conf: dict[str, Any]) -> None:
    from lab import watch
    from lab.nodes.cluster import REAL_NODE_LABEL, SYSTEM_LABEL

    images = built_images(cfg)
    slurm = conf.setdefault("autoheal:slurm", {})
    runner = conf.setdefault("autoheal:runner", {})
    monitoring = conf.setdefault("autoheal:monitoring", {})
    if "slurm" in images:
        slurm["images"] = dict.fromkeys(("controller", "slurmd", "login", "munge"), images["slurm"])
    if "runner" in images:
        runner["image"] = monitoring["watcherImage"] = images["runner"]
    # the lab's GPU simulator serves the DCGM metrics (there is no GPU and no exporter image)
    monitoring["dcgmExporter"] = False
    # and writes each node's kernel log: a lab node has no NVIDIA driver, and a container's device
    # cgroup refuses the host's /dev/kmsg (the watcher pods crash-looped on it in host labs)
    monitoring["watcherKernelLogDir"] = str(watch.kmsg_dir(cfg))
    # every lab node is a GPU node; the system pods go to real ones (a KWOK pod never runs)
    pool_taints = [t for p in conf.get("autoheal:pools") or [] for t in p.get("taints", [])]
    for part in (slurm, runner):
        if cfg.pods:  # the system node (lab.nodes.cluster.SYSTEM_NODE): no GPU, no taint
            part["nodeSelector"] = {SYSTEM_LABEL: "true"}
        else:
            part["nodeSelector"] = {REAL_NODE_LABEL: "true"}
            part["tolerateTaints"] = pool_taints
    key = ssh_key(cfg).with_suffix(".pub").read_text().strip()
    slurm["authorizedKeys"] = [*slurm.get("authorizedKeys", []), key]
    slurm["loginServiceType"] = "NodePort"
    slurm["waitForRollout"] = True
    # a lab's disks are small: the declared sizes are capacity numbers only (hostPath)
    slurm.setdefault("storage", {}).update(stateSize="1Gi", homeSize="1Gi", checkpointSize="1Gi")
    if cfg.pods:
        _pods_config(cfg, slurm, runner, monitoring)


# the lab's Python, as the software tree the jobs run (components/slurm/storage.py SoftwareVolume)
SOFTWARE_PYTHON = "/opt/sw/python"
SOFTWARE_SITE = "/opt/sw/site-packages"


def job_environment() -> dict[str, str]:
    """What a job needs to run the lab's Python from the software tree inside a slurmd pod: the
    interpreter finds its standard library beside itself; its shared library and the packages
    (PyTorch) are named, because their host paths are not the pod's."""
    return {
        "PYTHON": f"{SOFTWARE_PYTHON}/bin/python3",
        "PYTHONPATH": SOFTWARE_SITE,
        "LD_LIBRARY_PATH": f"{SOFTWARE_PYTHON}/lib",
    }


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _pods_config(
    cfg: LabConfig, slurm: dict[str, Any], runner: dict[str, Any], monitoring: dict[str, Any]
) -> None:
    """Slurm and the runner as pods: the runner's Service on a fixed node port (the host's way
    in, lab.runner.PROXY), its plays pointed at the pool controller's API on the lab bridge (the
    lab's cloud, which trusts the runner's ServiceAccount token as IRSA would), the lab's
    budgets and grace period, and the lab's Python mounted for the jobs. The XID watchers are
    the stack's DaemonSet, reading the kernel log the GPU simulator writes for their node and
    posting to the lab's Alertmanager on the bridge (lab.prom.start_bridge)."""
    import sys

    from lab.config import RUNNER_NODE_PORT
    from lab.nodes import cluster
    from remediation.incluster import SA_DIR

    gateway = cluster.context(cfg.run_dir).net.gateway
    monitoring.update(
        alertmanagerUrl=f"http://{gateway}:{cfg.port('alertmanager')}",
        # the lab injects, clears and injects again within minutes: short-lived alerts
        watcherResendSeconds=5,
        watcherHoldSeconds=20,
    )
    runner.update(serviceType="NodePort", nodePort=RUNNER_NODE_PORT)
    settings = runner.setdefault("settings", {})
    pool_size = sum(p.size + p.spares for p in cfg.pools)
    settings.setdefault("budgets", {"max_nodes": max(1, pool_size // 3), "max_pool_percent": 34})
    settings.setdefault("play_vars", {}).update(
        {
            "autoheal_backend": "lab",
            "autoheal_lab_url": f"http://{gateway}:{cfg.port('pool_controller')}",
            "autoheal_lab_token_file": str(SA_DIR / "token"),
            "autoheal_grace_seconds": cfg.grace_seconds,
        }
    )
    if cfg.lending:  # the runner pod's lender (remediation/lender.py), with the lab's timers
        settings["lending"] = {**cfg.lending, "enabled": True}
    slurm["graceSeconds"] = cfg.grace_seconds
    slurm["software"] = [
        {"name": "sw-python", "mountPath": SOFTWARE_PYTHON, "hostPath": sys.base_prefix},
        {"name": "sw-site", "mountPath": SOFTWARE_SITE, "hostPath": _site_packages()},
    ]


def _config_file(cfg: LabConfig) -> Path:
    data = yaml.safe_load((REPO / "Pulumi.lab.yaml").read_text())
    conf = data["config"]
    conf["autoheal:cluster"] = {"backend": "kubeconfig", "kubeconfig": str(cfg.kubeconfig)}
    pools = conf.get("autoheal:pools") or []
    for want, pool in zip(cfg.pools, pools, strict=False):
        pool.update(
            {
                "name": want.name,
                "prefix": want.prefix,
                "size": want.size,
                "spares": want.spares,
                "headroom": want.headroom,
                "gpusPerNode": want.gpus_per_node,
            }
        )
    if cfg.real_nodes:
        _real_node_config(cfg, conf)
    path = cfg.run_dir / "pulumi" / f"Pulumi.{STACK}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(cfg: LabConfig, *args: str, timeout: float = 600) -> str:
    from lab.pulumi_env import pulumi_bin, pulumi_env

    env = pulumi_env(cfg.run_dir / "pulumi")
    argv = [str(pulumi_bin()), *args, "--stack", STACK, "--non-interactive"]
    res = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if res.returncode != 0:
        log = cfg.run_dir / "logs" / "pulumi.log"
        log.write_text(res.stdout + res.stderr)
        why = _unready(cfg) if args[0] == "up" else ""
        raise LabError(
            f"pulumi {args[0]}: exit {res.returncode}; see {log}: {res.stderr.strip()[-300:]}{why}"
        )
    return res.stdout


def _unready(cfg: LabConfig) -> str:
    """What the provider's rollout error leaves out: each unready container's state and last log
    lines (lab.nodes.podreport); empty when the lab has no real nodes or nothing is unready."""
    if not cfg.real_nodes:
        return ""
    from lab.nodes import podreport

    try:
        text = podreport.report(cfg.kubeconfig)
    except Exception as exc:  # the report must never hide the error it explains
        return f"\n(pods not reported: {exc})"
    return f"\nPods not Ready:\n{text}" if text else ""


def _ensure_stack(cfg: LabConfig) -> Path:
    from lab.pulumi_env import pulumi_bin, pulumi_env

    conf = _config_file(cfg)
    env = pulumi_env(cfg.run_dir / "pulumi")
    subprocess.run(
        [str(pulumi_bin()), "stack", "init", STACK, "--non-interactive"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return conf


def up(cfg: LabConfig) -> str:
    """Create or update the lab stack; returns a one-line summary of what changed."""
    conf = _ensure_stack(cfg)
    # longer than the provider's own 10 min rollout wait, so its error (which pod, why) comes first
    out = _run(cfg, "up", "--yes", "--skip-preview", "--config-file", str(conf), timeout=1200)
    return _summary(out)


def preview_changes(cfg: LabConfig) -> dict[str, int]:
    """Operation counts of a `pulumi preview` ({"same": N} means no change)."""
    conf = _ensure_stack(cfg)
    out = _run(cfg, "preview", "--config-file", str(conf), "--json")
    data = json.loads(out)
    counts: dict[str, int] = data.get("changeSummary", {})
    return counts


def destroy(cfg: LabConfig) -> None:
    conf = _ensure_stack(cfg)
    _run(cfg, "destroy", "--yes", "--skip-preview", "--config-file", str(conf))


def _summary(out: str) -> str:
    """'37 created' / '2 updated, 35 unchanged' from the Resources section of `pulumi up`."""
    resources = out.split("Resources:", 1)[-1]
    found = re.findall(
        r"^\s*[-+~]?\s*(\d+ (?:created|updated|unchanged|deleted|replaced))\s*$", resources, re.M
    )
    return ", ".join(found) or "done"

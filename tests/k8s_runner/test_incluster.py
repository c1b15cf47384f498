"""The runner's identity in a pod (remediation.incluster, `in_cluster: true`) and what /readyz
reports about the API server and slurmctld (remediation.cluster_side), against the lab's real
API server and real Slurm."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from remediation.cluster_side import ClusterSide
from remediation.config import load_config
from remediation.errors import RunnerConfigError
from remediation.incluster import InCluster, write_kubeconfig
from tests.k8s_runner.conftest import Identity
from tests.runbook.conftest import REPO, Lab

POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def _config(tmp_path: Path, **extra: object) -> Path:
    (tmp_path / "token").write_text("t" * 32)
    shutil.copy(REPO / "config" / "rules.yaml", tmp_path / "rules.yaml")
    cfg = {
        "token_file": "token",
        "journal_path": "j.sqlite",
        "rules_file": "rules.yaml",
        "playbook_dir": ".",
        "state_dir": "state",
        **extra,
    }
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _sa_dir(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("header.payload.sig")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (sa / "namespace").write_text("autoheal")
    return sa


def test_in_a_pod_the_service_account_becomes_the_runners_and_the_plays_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = _sa_dir(tmp_path)
    monkeypatch.setattr("remediation.incluster.SA_DIR", sa)
    cfg = load_config(_config(tmp_path, in_cluster=True), env=POD_ENV)
    assert cfg.kubeconfig == (tmp_path / "state" / "incluster.kubeconfig").resolve()
    assert cfg.play_vars["autoheal_kubeconfig"] == str(cfg.kubeconfig)
    kc = yaml.safe_load(cfg.kubeconfig.read_text())
    assert kc["clusters"][0]["cluster"]["server"] == "https://10.96.0.1:443"
    # the token *file*: the kubelet rotates the projected token, readers read it again
    assert kc["users"][0]["user"] == {"tokenFile": str(sa / "token")}
    assert kc["contexts"][0]["context"]["namespace"] == "autoheal"
    assert cfg.kubeconfig.stat().st_mode & 0o777 == 0o600


def test_in_cluster_outside_a_pod_or_without_a_token_is_an_error_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RunnerConfigError, match="not a pod"):
        load_config(_config(tmp_path, in_cluster=True), env={})
    monkeypatch.setattr("remediation.incluster.SA_DIR", tmp_path / "no-such-dir")
    with pytest.raises(RunnerConfigError, match="automountServiceAccountToken"):
        load_config(_config(tmp_path, in_cluster=True), env=POD_ENV)


def test_without_in_cluster_a_pod_does_not_change_the_config(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path), env=POD_ENV)
    assert cfg.kubeconfig is None and "autoheal_kubeconfig" not in cfg.play_vars


@pytest.mark.lab
def test_readiness_is_clean_when_both_answer_and_names_the_cause_when_not(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Path
) -> None:
    good = ClusterSide(runner_identity.kubeconfig, kube_lab.slurm_conf, checks=True)
    assert good.problems() == []

    (tmp_path / "bad-token").write_text("not-a-token")
    forged = write_kubeconfig(
        InCluster(runner_identity.api_url, tmp_path / "bad-token", runner_identity.ca_file, "autoheal"),
        tmp_path / "forged.kubeconfig",
    )
    conf = kube_lab.slurm_conf.read_text()
    port = next(int(line.split("=", 1)[1]) for line in conf.splitlines() if line.startswith("SlurmctldPort="))
    wrong = tmp_path / "slurm.conf"
    wrong.write_text(conf.replace(f"SlurmctldPort={port}", f"SlurmctldPort={port + 9}"))
    bad = ClusterSide(forged, wrong, checks=True)
    problems = bad.problems()
    assert len(problems) == 2, problems
    assert "refused listing nodes: 401" in problems[0]
    assert "slurmctld not reachable" in problems[1] and str(wrong) in problems[1]
    assert (
        ClusterSide(None, kube_lab.slurm_conf, checks=True)
        .problems()[0]
        .startswith("Kubernetes: no kubeconfig")
    )


@pytest.mark.lab
def test_readyz_answers_503_with_the_causes(kube_lab: Lab, runner_identity: Identity, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from remediation.app import create_app
    from remediation.runtime import build

    path = _config(tmp_path, kubeconfig=str(tmp_path / "forged.kubeconfig"))
    (tmp_path / "bad-token").write_text("not-a-token")
    write_kubeconfig(
        InCluster(runner_identity.api_url, tmp_path / "bad-token", runner_identity.ca_file, "autoheal"),
        tmp_path / "forged.kubeconfig",
    )
    cfg = load_config(path, env={})
    rt = build(cfg, with_worker=False)
    rt.cluster = ClusterSide(cfg.kubeconfig, kube_lab.slurm_conf, checks=True)
    with TestClient(create_app(rt)) as client:
        r: httpx.Response = client.get("/readyz")
    assert r.status_code == 503
    assert r.text.splitlines() == [next(iter(rt.cluster.problems()))]
    assert "401" in r.text

"""RemediationRunner: least-privilege RBAC, a generated token Secret, and a Deployment using both."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from components.runner import RUNNER_RBAC_RULES, RemediationRunner, RemediationRunnerArgs
from tests.components.harness import FAKE_SECRET, env_of, pod_spec, run_program

CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"


def _granted(role) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role.inputs["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_grants_exactly_what_the_runbook_needs(lab):
    role = lab.one(CLUSTER_ROLE, "autoheal-runner")
    assert _granted(role) == {
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("apps", "controllerrevisions", "list"),  # the slurmd rollout's stale pods
    }
    assert len(role.inputs["rules"]) == len(RUNNER_RBAC_RULES)


def test_events_are_granted_in_the_audit_namespace_only(lab):
    role = lab.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-events")
    assert role.inputs["metadata"]["namespace"] == "default"
    assert _granted(role) == {("", "events", "get"), ("", "events", "list"), ("", "events", "create")}
    binding = lab.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "autoheal-runner-events")
    assert binding.inputs["roleRef"]["kind"] == "Role"
    assert binding.inputs["subjects"] == [
        {"kind": "ServiceAccount", "name": "autoheal-runner", "namespace": "autoheal"}
    ]


def test_no_role_in_the_stack_has_a_wildcard(lab):
    roles = lab.of_type(CLUSTER_ROLE) + lab.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert roles
    for role in roles:
        for rule in role.inputs["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (role.k8s_name, field)


def test_binding_gives_the_role_to_the_runner_service_account_only(lab):
    binding = lab.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "autoheal-runner")
    assert binding.inputs["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "autoheal-runner",
    }
    assert binding.inputs["subjects"] == [
        {"kind": "ServiceAccount", "name": "autoheal-runner", "namespace": "autoheal"}
    ]
    deployment = lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
    assert pod_spec(deployment)["serviceAccountName"] == "autoheal-runner"


def test_token_is_generated_into_a_secret_not_taken_from_config(lab):
    secret = lab.one("kubernetes:core/v1:Secret", "autoheal-runner-token")
    generated = [r for r in lab.of_type("pulumi-python:dynamic:Resource") if r.name == "runner-token"]
    assert len(generated) == 1 and generated[0].inputs["length"] == 32
    # The Secret's value is exactly the generator's `token` output (here the mock's fixed bytes).
    expected = base64.urlsafe_b64encode(FAKE_SECRET).decode().rstrip("=")
    assert secret.inputs["stringData"] == {"token": expected}


def test_runner_reads_its_token_from_the_mounted_secret(lab):
    spec = pod_spec(lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))
    (container,) = spec["containers"]
    token_file = env_of(container)["AUTOHEAL_TOKEN_FILE"]["value"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    assert volumes[mount["name"]]["secret"]["secretName"] == "autoheal-runner-token"
    assert mount.get("readOnly") is True


def test_runner_config_matches_the_runners_own_schema(lab):
    from remediation.config import parse_config

    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    settings = yaml.safe_load(cm.inputs["data"]["runner.yaml"])
    cfg = parse_config(settings, "runner.yaml", base=__import__("pathlib").Path("/"), env={})
    assert str(cfg.token_file) == "/var/run/secrets/autoheal/token"
    assert str(cfg.journal_path).startswith("/var/lib/autoheal/")
    assert cfg.listen_port == 9095


def test_journal_is_on_a_claim_and_the_runner_is_a_single_writer(lab):
    dep = lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
    assert dep.inputs["spec"]["replicas"] == 1
    assert dep.inputs["spec"]["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
    claim = volumes["journal"]["persistentVolumeClaim"]["claimName"]
    assert lab.one("kubernetes:core/v1:PersistentVolumeClaim", claim)


def test_webhook_url_is_the_runner_service(lab):
    assert lab.value["webhook_url"] == "http://autoheal-runner.autoheal.svc:8080/webhook"
    svc = lab.one("kubernetes:core/v1:Service", "autoheal-runner")
    assert svc.inputs["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http"}]


def test_webhook_url_is_the_one_the_shipped_alertmanager_config_calls(lab):
    from autoheal.monitoring import SHIPPED_RUNNER_URL

    assert lab.value["webhook_url"] == SHIPPED_RUNNER_URL


def test_rules_ship_as_a_config_map_and_playbooks_come_from_the_image(lab):
    from images.python import PREFIX, data_items, project_root
    from images.recipes import RUNNER

    config = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    assert config.inputs["data"]["rules.yaml"] == "rules: []\n"
    assert not [
        c for c in lab.of_type("kubernetes:core/v1:ConfigMap") if c.k8s_name == "autoheal-runner-playbooks"
    ]
    settings = yaml.safe_load(config.inputs["data"]["runner.yaml"])
    # where images/python.py puts the project, with everything the playbooks include
    assert RUNNER.runtime.working_dir == f"{PREFIX}/share/autoheal"
    assert settings["playbook_dir"] == f"{PREFIX}/share/autoheal/playbooks"
    assert {"playbooks", "roles", "collections", "ansible.cfg"} <= set(data_items(project_root()))
    (container,) = pod_spec(lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))["containers"]
    assert env_of(container)["ANSIBLE_CONFIG"]["value"] == f"{PREFIX}/share/autoheal/ansible.cfg"


def test_the_pod_uses_its_service_account_has_scratch_probes_and_resources(lab):
    from remediation.config import parse_config

    spec = pod_spec(lab.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))
    assert spec["automountServiceAccountToken"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    scratch = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in volumes[scratch["name"]]
    assert env_of(container)["HOME"]["value"] == "/tmp"
    # Ansible's getpass.getuser() reads these first (without them the plays failed at import in the
    # pods lab); with Slurm access the runner is the cluster's SlurmUser (Debian's uid 64030):
    # without slurmdbd only root and SlurmUser may drain nodes and requeue others' jobs
    assert env_of(container)["USER"]["value"] == env_of(container)["LOGNAME"]["value"] == "slurm"
    assert spec["securityContext"]["runAsUser"] == 64030 and spec["securityContext"]["runAsNonRoot"]
    for var in ("ANSIBLE_REMOTE_TMP", "ANSIBLE_ASYNC_DIR"):  # not ~: SlurmUser's home is /nonexistent
        assert env_of(container)[var]["value"].startswith("/tmp/")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    cfg = parse_config(yaml.safe_load(cm.inputs["data"]["runner.yaml"]), "runner.yaml", Path("/"), env={})
    assert cfg.in_cluster and cfg.cluster_checks and cfg.cordon_sync.enabled
    assert cfg.kubeconfig is None  # never a kubeconfig in a Secret: the pod's token


def test_with_slurm_access_munged_runs_beside_the_runner_with_the_clusters_key_and_config():
    from components.runner_pod import RunnerSlurmArgs

    slurm = RunnerSlurmArgs(config={"slurm.conf": "ClusterName=x\n"}, munge_key_base64="a2V5")
    rec = run_program(lambda: RemediationRunner("r", RemediationRunnerArgs(slurm=slurm)))
    assert rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-slurm").inputs["data"] == {
        "slurm.conf": "ClusterName=x\n"
    }
    assert rec.one("kubernetes:core/v1:Secret", "autoheal-runner-munge").inputs["data"] == {
        "munge.key": "a2V5"
    }
    spec = pod_spec(rec.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))
    copy, munged = spec["initContainers"]
    assert copy["name"] == "munge-key" and "install -m 0400" in copy["command"][-1]
    assert munged["restartPolicy"] == "Always"  # a native sidecar, started before the runner
    assert "--force" in munged["command"] and munged["startupProbe"]["exec"]["command"][0] == "test"
    (runner,) = spec["containers"]
    assert env_of(runner)["SLURM_CONF"]["value"] == "/etc/slurm/slurm.conf"
    shared = {m["name"] for m in runner["volumeMounts"]} & {m["name"] for m in munged["volumeMounts"]}
    assert shared == {"munge-socket"}
    cm = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    assert yaml.safe_load(cm.inputs["data"]["runner.yaml"])["play_vars"]["autoheal_slurm_conf"] == (
        "/etc/slurm/slurm.conf"
    )


def test_changing_a_playbook_rolls_the_runner():
    def hash_for(playbook: str) -> str:
        rec = run_program(
            lambda: RemediationRunner("r", RemediationRunnerArgs(playbooks={"a.yml": playbook}))
        )
        dep = rec.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
        return str(dep.inputs["spec"]["template"]["metadata"]["annotations"]["autoheal.io/config-hash"])

    assert hash_for("- hosts: all\n") != hash_for("- hosts: none\n")


@pytest.mark.parametrize("bad", [{"webhook_path": "webhook"}, {"playbooks": {"dir/a.yml": ""}}])
def test_runner_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        RemediationRunnerArgs(**bad).validate()


def _ha_runner(**over):
    from components.common import SecretRef
    from components.runner import RunnerPostgresArgs

    pg = RunnerPostgresArgs(
        url="postgresql://autoheal@journal.db.svc:5432/autoheal?sslmode=verify-full",
        password=SecretRef(name="journal-db", key="password", namespace="autoheal"),
    )
    args = RemediationRunnerArgs(journal="postgres", postgres=pg, replicas=2, **over)
    return run_program(lambda: RemediationRunner("r", args))


def test_with_a_postgres_journal_the_runner_runs_replicas_with_leader_election():
    """Issue 17: replicas share a PostgreSQL journal, one Lease elects the leader, a PDB keeps one."""
    from remediation.config import parse_config

    rec = _ha_runner()
    dep = rec.one("kubernetes:apps/v1:Deployment", "autoheal-runner")
    assert dep.inputs["spec"]["replicas"] == 2
    strategy = dep.inputs["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0
    spec = pod_spec(dep)
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert not rec.of_type("kubernetes:core/v1:PersistentVolumeClaim")  # no single-writer claim
    assert "emptyDir" in {v["name"]: v for v in spec["volumes"]}["journal"]
    (container,) = spec["containers"]
    env = env_of(container)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "journal-db", "key": "password"}
    pdb = rec.one("kubernetes:policy/v1:PodDisruptionBudget", "autoheal-runner")
    assert pdb.inputs["spec"]["minAvailable"] == 1
    assert pdb.inputs["spec"]["selector"] == dep.inputs["spec"]["selector"]
    role = rec.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-leader-election")
    assert role.inputs["metadata"]["namespace"] == "autoheal"
    assert _granted(role) == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    binding = rec.one(
        "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "autoheal-runner-leader-election"
    )
    assert binding.inputs["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "autoheal-runner-leader-election",
    }
    cm = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    cfg = parse_config(yaml.safe_load(cm.inputs["data"]["runner.yaml"]), "runner.yaml", Path("/"), env={})
    assert cfg.journal_path is None and cfg.journal_dsn is not None and "verify-full" in cfg.journal_dsn
    assert cfg.leader_election.enabled and cfg.leader_election.identity == ""  # POD_NAME at runtime


def test_the_sqlite_runner_has_no_lease_role_and_no_pdb(lab):
    assert not [
        r for r in lab.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role") if "leader" in r.k8s_name
    ]
    assert not lab.of_type("kubernetes:policy/v1:PodDisruptionBudget")


@pytest.mark.parametrize(
    ("bad", "names"),
    [
        ({"replicas": 2}, "journal='postgres'"),
        ({"journal": "postgres"}, "postgres=RunnerPostgresArgs"),
        ({"replicas": 0}, "replicas"),
        ({"journal": "mysql"}, "journal must be"),
    ],
)
def test_replicas_need_a_shared_journal(bad, names):
    with pytest.raises(ValueError, match=re.escape(names)):
        RemediationRunnerArgs(**bad).validate()


def test_a_postgres_url_with_a_password_is_refused():
    from components.runner import RunnerPostgresArgs

    args = RemediationRunnerArgs(
        journal="postgres", postgres=RunnerPostgresArgs(url="postgresql://u:pw@h/db")
    )
    with pytest.raises(ValueError, match="must not carry a password"):
        args.validate()


def test_a_node_port_is_only_for_a_node_port_service():
    from components.runner import RemediationRunner, RemediationRunnerArgs

    rec = run_program(
        lambda: RemediationRunner("runner", RemediationRunnerArgs(service_type="NodePort", node_port=30095))
    )
    svc = rec.one("kubernetes:core/v1:Service", "autoheal-runner")
    assert svc.inputs["spec"]["type"] == "NodePort"
    assert svc.inputs["spec"]["ports"][0]["nodePort"] == 30095
    with pytest.raises(ValueError, match="node_port needs service_type='NodePort'"):
        run_program(lambda: RemediationRunner("runner", RemediationRunnerArgs(node_port=30095)))


def test_the_spare_keeper_may_read_the_pool_configmaps_of_its_own_namespace_only():
    """Issue 32: the leader's spare keeper lists the pools' ConfigMaps (a Role in the runner's
    namespace, never cluster-wide) and marks nodes with the ClusterRole's nodes patch; both fleet
    loops are turned on in runner.yaml."""
    from remediation.config import parse_config

    rec = run_program(
        lambda: RemediationRunner("r", RemediationRunnerArgs(spare_keeper=True, dead_nodes=True))
    )
    role = rec.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-pools")
    assert role.inputs["metadata"]["namespace"] == "autoheal"
    assert _granted(role) == {("", "configmaps", "get"), ("", "configmaps", "list")}
    binding = rec.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "autoheal-runner-pools")
    assert binding.inputs["roleRef"]["name"] == "autoheal-runner-pools"
    assert ("", "nodes", "patch") in _granted(rec.one(CLUSTER_ROLE, "autoheal-runner"))
    cm = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    cfg = parse_config(yaml.safe_load(cm.inputs["data"]["runner.yaml"]), "runner.yaml", Path("/"), env={})
    assert cfg.spare_keeper.enabled and cfg.dead_nodes.enabled
    plain = run_program(lambda: RemediationRunner("r", RemediationRunnerArgs()))
    assert not [
        r
        for r in plain.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
        if "pools" in (r.k8s_name or "")
    ]
    # the stack's runner settings may turn it on too (autoheal:runner settings.spare_keeper)
    args = RemediationRunnerArgs(settings={"spare_keeper": {"enabled": True, "interval_seconds": 30}})
    by_settings = run_program(lambda: RemediationRunner("r", args))
    assert by_settings.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-pools")


def test_a_karpenter_pool_gives_the_runner_its_nodeclaims_and_no_more():
    """The karpenter backend deletes a retired node's NodeClaim and reads NodePools; the runner is
    granted that only when a pool names the backend."""
    args = RemediationRunnerArgs(settings={"pool_backends": {"h100": "karpenter", "a100": "aws"}})
    granted = _granted(run_program(lambda: RemediationRunner("r", args)).one(CLUSTER_ROLE, "autoheal-runner"))
    assert {g for g in granted if g[0] == "karpenter.sh"} == {
        ("karpenter.sh", "nodepools", "get"),
        ("karpenter.sh", "nodepools", "list"),
        ("karpenter.sh", "nodeclaims", "get"),
        ("karpenter.sh", "nodeclaims", "list"),
        ("karpenter.sh", "nodeclaims", "delete"),
    }
    plain = RemediationRunnerArgs(settings={"pool_backends": {"h100": "aws"}})
    granted = _granted(
        run_program(lambda: RemediationRunner("r", plain)).one(CLUSTER_ROLE, "autoheal-runner")
    )
    assert not [g for g in granted if g[0] == "karpenter.sh"]


def test_the_ladders_jobs_are_granted_in_the_runners_namespace_only(lab):
    """Reset and DCGM validation Jobs (autoheal.cluster.node_job): read by name, created, deleted,
    and their pods' logs read - in the runner's namespace, nothing cluster-wide."""
    role = lab.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-ladder-jobs")
    assert role.inputs["metadata"]["namespace"] == "autoheal"
    assert _granted(role) == {
        ("batch", "jobs", "get"),
        ("batch", "jobs", "create"),
        ("batch", "jobs", "delete"),
        ("", "pods/log", "get"),
    }
    binding = lab.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "autoheal-runner-ladder-jobs")
    assert binding.inputs["roleRef"]["name"] == "autoheal-runner-ladder-jobs"
    assert ("batch", "jobs", "create") not in _granted(lab.one(CLUSTER_ROLE, "autoheal-runner"))


def test_the_stack_gives_the_ladder_its_dcgm_image_job_namespace_and_prometheus():
    from components.config import parse_stack_config
    from components.stack import _ladder_play_vars
    from tests.components.harness import lab_stack_raw

    def play_vars(monitoring: dict[str, object], namespace: str = "autoheal") -> dict[str, object]:
        raw = {**lab_stack_raw(), "namespace": namespace, "monitoring": monitoring}
        return _ladder_play_vars(parse_stack_config(raw))

    image = "nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "c" * 64
    assert play_vars({"dcgmImage": image, "prometheusUrl": "http://prom.example:9090"}, "gpu-ops") == {
        "autoheal_job_namespace": "gpu-ops",  # the runner's Role allows the Jobs there only
        "autoheal_dcgm_image": image,
        "autoheal_prometheus_url": "http://prom.example:9090",
    }
    # with the Prometheus Operator, its prometheus-operated Service
    assert play_vars({"prometheusOperator": True})["autoheal_prometheus_url"] == (
        "http://prometheus-operated.monitoring.svc:9090"
    )
    # none configured: the role's empty image default stands (the dcgm backend fails naming it),
    # and evidence reads no Prometheus
    assert play_vars({}) == {"autoheal_job_namespace": "autoheal"}

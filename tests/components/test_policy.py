"""The policy pack's rules, called directly with fake resource properties."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from policy import rules

CM = "kubernetes:core/v1:ConfigMap"
STS = "kubernetes:apps/v1:StatefulSet"
DEP = "kubernetes:apps/v1:Deployment"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"


def pool_cm(
    spares: int = 2, remediation: bool = True, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "autoheal-pool-h100",
            "labels": {"app.kubernetes.io/component": "node-pool", "autoheal.io/pool": "h100"},
            "annotations": {
                "autoheal.io/remediation": "enabled" if remediation else "disabled",
                **(annotations or {}),
            },
        },
        "data": {
            "pool.json": json.dumps(
                {"name": "h100", "spares": spares, "remediation": {"enabled": remediation}}
            )
        },
    }


def controller(
    volumes: Sequence[Any] = (),
    claim_templates: Sequence[Any] = (),
    mounts: Sequence[Any] = (),
    kind_labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "slurmctld",
            "labels": kind_labels or {"app.kubernetes.io/component": "slurmctld"},
            "annotations": annotations or {"autoheal.io/state-dir": "/var/spool/slurmctld"},
        },
        "spec": {
            "volumeClaimTemplates": list(claim_templates),
            "template": {
                "spec": {
                    "containers": [{"name": "slurmctld", "volumeMounts": list(mounts)}],
                    "volumes": list(volumes),
                }
            },
        },
    }


# --- GPU pools ---------------------------------------------------------------------------------


def test_pool_with_spares_and_remediation_passes():
    assert rules.gpu_pool_has_spares_and_remediation(CM, pool_cm()) == []


def test_pool_without_spares_is_a_violation():
    (msg,) = rules.gpu_pool_has_spares_and_remediation(CM, pool_cm(spares=0))
    assert "no hot spares" in msg and "autoheal.io/policy-waiver" in msg


def test_pool_without_remediation_is_a_violation():
    (msg,) = rules.gpu_pool_has_spares_and_remediation(CM, pool_cm(remediation=False))
    assert "remediation disabled" in msg


def test_a_waiver_with_a_reason_allows_a_pool_without_spares_or_remediation():
    waived = pool_cm(spares=0, remediation=False, annotations={"autoheal.io/policy-waiver": "dev"})
    assert rules.gpu_pool_has_spares_and_remediation(CM, waived) == []
    blank = pool_cm(spares=0, annotations={"autoheal.io/policy-waiver": "  "})
    assert rules.gpu_pool_has_spares_and_remediation(CM, blank) != []


def test_other_config_maps_are_not_pools():
    assert rules.gpu_pool_has_spares_and_remediation(CM, {"metadata": {"name": "x"}}) == []


def test_eks_node_group_that_may_shrink_below_its_spares_is_a_violation():
    group: dict[str, Any] = {
        "labels": {"autoheal.io/pool": "h100"},
        "scalingConfig": {"desiredSize": 18, "minSize": 16, "maxSize": 22},
    }
    assert rules.gpu_pool_has_spares_and_remediation("aws:eks/nodeGroup:NodeGroup", group)
    group["scalingConfig"]["minSize"] = 18
    assert rules.gpu_pool_has_spares_and_remediation("aws:eks/nodeGroup:NodeGroup", group) == []


def test_stack_with_remediated_pools_needs_a_runner():
    runner = {"metadata": {"name": "r", "labels": {"app.kubernetes.io/component": "remediation-runner"}}}
    assert rules.stack_has_remediation([(CM, pool_cm())])
    assert rules.stack_has_remediation([(CM, pool_cm()), (DEP, runner)]) == []
    waived = pool_cm(remediation=False, annotations={"autoheal.io/policy-waiver": "manual only"})
    assert rules.stack_has_remediation([(CM, waived)]) == []


# --- persistent controller state ----------------------------------------------------------------


def test_controller_with_state_on_a_claim_template_passes():
    sts = controller(
        claim_templates=[{"metadata": {"name": "state"}}],
        mounts=[{"name": "state", "mountPath": "/var/spool/slurmctld"}],
    )
    assert rules.controller_state_is_persistent(STS, sts) == []


def test_controller_with_state_on_a_pvc_volume_mounted_above_the_dir_passes():
    sts = controller(
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "ctld"}}],
        mounts=[{"name": "data", "mountPath": "/var/spool"}],
    )
    assert rules.controller_state_is_persistent(STS, sts) == []


def test_controller_with_state_on_an_empty_dir_is_a_violation():
    sts = controller(
        volumes=[{"name": "state", "emptyDir": {}}],
        mounts=[{"name": "state", "mountPath": "/var/spool/slurmctld"}],
    )
    (msg,) = rules.controller_state_is_persistent(STS, sts)
    assert "not on a PersistentVolumeClaim" in msg


def test_controller_as_a_deployment_is_a_violation():
    (msg,) = rules.controller_state_is_persistent(DEP, controller())
    assert "must be a StatefulSet" in msg


def test_any_workload_declaring_a_state_dir_must_keep_it_on_a_claim():
    runner = controller(
        kind_labels={"app.kubernetes.io/component": "remediation-runner"},
        annotations={"autoheal.io/state-dir": "/var/lib/autoheal"},
        mounts=[{"name": "j", "mountPath": "/tmp"}],
    )
    assert rules.controller_state_is_persistent(DEP, runner)


# --- RBAC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["apiGroups", "resources", "verbs"])
def test_wildcard_in_any_rbac_field_is_a_violation(field):
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    rule[field] = ["*"]
    (msg,) = rules.no_wildcard_rbac(ROLE, {"metadata": {"name": "r"}, "rules": [rule]})
    assert f"rules[0].{field}" in msg


def test_subresource_wildcard_is_a_violation_and_exact_rules_pass():
    role = {"rules": [{"apiGroups": [""], "resources": ["pods/*"], "verbs": ["create"]}]}
    assert rules.no_wildcard_rbac(ROLE, role)
    exact = {"rules": [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]}
    assert rules.no_wildcard_rbac(ROLE, exact) == []
    assert rules.no_wildcard_rbac(CM, {"rules": [{"verbs": ["*"]}]}) == []


# --- the webhook token ------------------------------------------------------------------------


def am_cm(http_config: dict[str, Any] | None) -> dict[str, Any]:
    hook = {"url": "http://runner/webhook", **({"http_config": http_config} if http_config else {})}
    cfg = {"route": {"receiver": "r"}, "receivers": [{"name": "r", "webhook_configs": [hook]}]}
    return {
        "metadata": {"name": "am", "labels": {"autoheal.io/alertmanager-config": "true"}},
        "data": {"alertmanager.yml": yaml.safe_dump(cfg)},
    }


def test_alertmanager_webhook_with_a_token_file_passes():
    ok = am_cm({"authorization": {"type": "Bearer", "credentials_file": "/etc/am/secrets/t/token"}})
    assert rules.webhook_requires_token(CM, ok) == []


def test_alertmanager_webhook_without_a_token_is_a_violation():
    (msg,) = rules.webhook_requires_token(CM, am_cm(None))
    assert "no bearer token" in msg


def test_alertmanager_webhook_with_an_inline_token_is_a_violation():
    (msg,) = rules.webhook_requires_token(CM, am_cm({"authorization": {"credentials": "hunter2"}}))
    assert "inline" in msg


def test_alertmanager_config_resource_needs_a_secret_selector():
    cr = "kubernetes:monitoring.coreos.com/v1alpha1:AlertmanagerConfig"
    spec: dict[str, Any] = {"receivers": [{"name": "r", "webhookConfigs": [{"url": "http://x"}]}]}
    assert rules.webhook_requires_token(cr, {"spec": spec})
    spec["receivers"][0]["webhookConfigs"][0]["httpConfig"] = {
        "authorization": {"credentials": {"name": "autoheal-runner-token", "key": "token"}}
    }
    assert rules.webhook_requires_token(cr, {"spec": spec}) == []


def runner_deployment(env: list[Any], volumes: list[Any], mounts: list[Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "runner", "labels": {"app.kubernetes.io/component": "remediation-runner"}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "runner", "env": env, "volumeMounts": mounts}],
                    "volumes": volumes,
                }
            }
        },
    }


def test_runner_without_a_token_is_a_violation():
    (msg,) = rules.webhook_requires_token(DEP, runner_deployment([], [], []))
    assert "no webhook token" in msg


def test_runner_token_from_a_mounted_secret_passes_and_from_elsewhere_fails():
    env = [{"name": "AUTOHEAL_TOKEN_FILE", "value": "/run/token/token"}]
    secret = [{"name": "t", "secret": {"secretName": "autoheal-runner-token"}}]
    mounts = [{"name": "t", "mountPath": "/run/token"}]
    assert rules.webhook_requires_token(DEP, runner_deployment(env, secret, mounts)) == []
    empty = [{"name": "t", "emptyDir": {}}]
    assert rules.webhook_requires_token(DEP, runner_deployment(env, empty, mounts))


def test_components_and_policy_spell_no_label_of_their_own():
    """Labels, taints, annotations and the GPU resource name have one definition,
    autoheal.labels: no string literal in components/ or policy/ spells one again."""
    import ast

    from tests.components.harness import ROOT

    spelled = []
    for folder in ("components", "policy", "review"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            body_docs = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
                and n.body
                and isinstance(n.body[0], ast.Expr)
            }
            spelled += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in body_docs
                and node.value.startswith(("autoheal.io/", "app.kubernetes.io/", "nvidia.com/gpu"))
            ]
    assert spelled == []


def test_policy_pack_module_builds_the_pack(monkeypatch):
    """policy/__main__.py declares the pack with every rule (PolicyPack construction is captured
    instead of serving gRPC)."""
    import runpy

    import pulumi_policy

    made = {}

    class FakePack:
        def __init__(self, name, policies, **kw):
            made["name"] = name
            made["policies"] = [p.name for p in policies]

    monkeypatch.setattr(pulumi_policy, "PolicyPack", FakePack)
    runpy.run_path(str(rules.__file__).replace("rules.py", "__main__.py"), run_name="__main__")
    assert made["name"] == "autoheal"
    assert set(made["policies"]) == {
        *rules.RESOURCE_RULES,
        "gpu-pools-have-a-runner",
        "images-pinned-by-digest",
    }


def test_preview_check_judges_the_resources_of_a_preview_json(tmp_path, capsys):
    from policy import preview_check

    role = {"metadata": {"name": "bad"}, "rules": [{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}]}
    preview = {
        "steps": [
            {
                "op": "create",
                "urn": "urn:pulumi:s::p::x$kubernetes:core/v1:ConfigMap::pool",
                "newState": {"type": CM, "inputs": pool_cm(spares=0)},
            },
            {
                "op": "same",
                "urn": "urn:pulumi:s::p::kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::r",
                "newState": {"type": ROLE, "inputs": role},
            },
            {
                "op": "delete",
                "urn": "urn:pulumi:s::p::kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::gone",
                "oldState": {"type": ROLE, "inputs": role},
            },
        ]
    }
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(preview))
    assert preview_check.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "[gpu-pool-spares-and-remediation]" in out
    assert "[no-wildcard-rbac]" in out and "::r:" in out
    assert "[gpu-pools-have-a-runner]" in out
    assert "3 resources" not in out and "2 resources, 3 violations" in out
    path.write_text(json.dumps({"steps": []}))
    assert preview_check.main([str(path)]) == 0
    path.write_text("not json")
    assert preview_check.main([str(path)]) == 2

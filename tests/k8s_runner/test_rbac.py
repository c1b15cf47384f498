"""Least privilege, proven on the real API server: the runner's ServiceAccount, with exactly the
RBAC its Pulumi component declares, runs the XID runbook end to end (cordon, taint, drain through
kubernetes.core.k8s_drain, opt-out reads, audit Events, spare promotion) and is refused what the
runbook does not need. The API server's audit log shows who acted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lab import controlplane
from remediation.kubeview import RealKube
from tests.k8s_runner.conftest import RUNNER_NS, RUNNER_SA, Identity
from tests.runbook.conftest import Lab, run_playbook
from tests.runbook.test_playbooks import deployment_on, fault_vars, quarantine_taint
from tests.support import wait_for

pytestmark = pytest.mark.lab

RUNNER_USER = f"system:serviceaccount:{RUNNER_NS}:{RUNNER_SA}"


# the control plane's own writers (the node lifecycle controller mirrors a cordon as a taint)
_CONTROL_PLANE_AGENTS = ("kube-controller-manager/", "kube-scheduler/", "kwok/")


def _writes_by(lab: Lab, resource: str, verb: str, name: str | None = None) -> set[str]:
    """Users who did `verb` on `resource` (subresource as "pods/eviction"), per the audit log,
    leaving out the control plane's own controllers."""
    users = set()
    for ev in controlplane.audit_log(lab.run_dir):
        ref = ev.get("objectRef") or {}
        res = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        if str(ev.get("userAgent", "")).startswith(_CONTROL_PLANE_AGENTS):
            continue
        if res == resource and ev.get("verb") == verb and (name is None or ref.get("name") == name):
            users.add(ev["user"]["username"])
    return users


def test_pods_get_a_projected_service_account_token(kube_lab: Lab, runner_identity: Identity) -> None:
    """The ServiceAccount admission plugin is on: a pod of the runner's account is given its
    token as a projected volume, and the API server accepts tokens it signed."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sa-probe", "namespace": RUNNER_NS},
        "spec": {
            "serviceAccountName": RUNNER_SA,
            "nodeName": "gpu-4",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "fake"}],
        },
    }
    kube_lab.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    got = json.loads(kube_lab.kubectl("get", "pod", "sa-probe", "-n", RUNNER_NS, "-o", "json"))
    projected = [v for v in got["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert projected, got["spec"]["volumes"]
    sources = projected[0]["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources), sources
    with runner_identity.http() as http:
        review = http.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    assert review.status_code == 201, review.text
    assert review.json()["status"]["userInfo"]["username"] == RUNNER_USER
    kube_lab.kubectl("delete", "pod", "sa-probe", "-n", RUNNER_NS, "--wait=false")


def test_the_policy_reads_work_as_the_runner(kube_lab: Lab, runner_identity: Identity) -> None:
    """Opt-out labels on nodes and on pods in any namespace, pools, hand-uncordoned nodes."""
    view = RealKube(runner_identity.kubeconfig)
    kube_lab.kubectl("label", "node", "gpu-3", "autoheal.io/opt-out=true", "--overwrite")
    try:
        assert "gpu-3" in view.nodes_labelled("autoheal.io/opt-out")
        assert view.nodes_with_labelled_pods("autoheal.io/opt-out") == set()
        assert set(view.pools("autoheal.io/pool")) >= {"gpu-1", "gpu-2", "gpu-3", "gpu-4"}
        assert view.uncordoned("autoheal.io/state=quarantined") == set()
    finally:
        kube_lab.kubectl("label", "node", "gpu-3", "autoheal.io/opt-out-")


def test_the_runbook_passes_with_the_runners_service_account(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Any
) -> None:
    lab = kube_lab
    pods_on_bad = deployment_on(lab, "gpu-1")
    job = lab.sbatch("-N1", "-w", "gpu-1", "-o", "/dev/null", "--wrap", "sleep 3000")
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        extra = {
            **fault_vars(lab, "gpu-1", "inc-rbac", autoheal_backend="none"),
            "autoheal_kubeconfig": str(runner_identity.kubeconfig),
        }
        res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-6000:]
        node = lab.kube_node("gpu-1")
        assert node is not None and node["spec"]["unschedulable"] is True
        assert quarantine_taint(node)
        assert node["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
        wait_for(lambda: not pods_on_bad(), 60, "the deployment's pod evicted from gpu-1")
        assert "AutohealFenced" in lab.kubectl(
            "get", "events", "--field-selector", "involvedObject.name=gpu-1"
        )
        phases = {e["phase"] for e in lab.journal_lines()}
        assert {"fenced", "drained", "spare_promoted", "done"} <= phases, phases
        # every write of the runbook to Kubernetes came from the runner's identity
        assert _writes_by(lab, "nodes", "patch", "gpu-1") == {RUNNER_USER}
        assert _writes_by(lab, "pods/eviction", "create") == {RUNNER_USER}
        assert RUNNER_USER in _writes_by(lab, "events", "create")
        promoted = [n for n in ("gpu-5", "gpu-6") if RUNNER_USER in _writes_by(lab, "nodes", "patch", n)]
        assert promoted, "no spare was promoted by the runner"
        again = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-5000:]
    finally:
        lab.slurm("scancel", str(job), check=False)


# (what, method, path, body): everything here must be refused with 403 Forbidden
_NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "intruder"}}
_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "intruder"},
    "spec": {"containers": [{"name": "c", "image": "fake"}]},
}
_EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "intruder"},
    "involvedObject": {"kind": "Node", "name": "gpu-2"},
}
REFUSED: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("secrets: list, all namespaces", "GET", "/api/v1/secrets", None),
    ("secrets: list in its own namespace", "GET", f"/api/v1/namespaces/{RUNNER_NS}/secrets", None),
    (
        "secrets: get the webhook token",
        "GET",
        f"/api/v1/namespaces/{RUNNER_NS}/secrets/autoheal-runner-token",
        None,
    ),
    ("configmaps: list", "GET", "/api/v1/configmaps", None),
    ("nodes: delete", "DELETE", "/api/v1/nodes/gpu-2", None),
    ("nodes: create", "POST", "/api/v1/nodes", _NODE),
    (
        "pods: delete (bypassing eviction and PDBs)",
        "DELETE",
        "/api/v1/namespaces/default/pods/anything",
        None,
    ),
    ("pods: create", "POST", "/api/v1/namespaces/default/pods", _POD),
    ("pods: create in kube-system", "POST", "/api/v1/namespaces/kube-system/pods", _POD),
    ("pods/exec", "POST", "/api/v1/namespaces/default/pods/anything/exec?command=true", None),
    ("events: create outside the audit namespace", "POST", "/api/v1/namespaces/kube-system/events", _EVENT),
    ("events: list outside the audit namespace", "GET", "/api/v1/namespaces/kube-system/events", None),
    (
        "serviceaccounts/token: mint another identity",
        "POST",
        f"/api/v1/namespaces/{RUNNER_NS}/serviceaccounts/default/token",
        {"spec": {}},
    ),
    ("deployments: list", "GET", "/apis/apps/v1/deployments", None),
    (
        "clusterrolebindings: create (escalation)",
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": "x"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [],
        },
    ),
]


@pytest.mark.parametrize(("what", "method", "path", "body"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_api_server_refuses_what_the_runbook_does_not_need(
    runner_identity: Identity, what: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    with runner_identity.http() as http:
        r = http.request(method, path, json=body)
    assert r.status_code == 403, f"{what}: {method} {path} answered {r.status_code}: {r.text[:300]}"
    assert RUNNER_USER in r.text


def test_the_ladders_jobs_work_as_the_runner_in_its_namespace_only(runner_identity: Identity) -> None:
    """autoheal.cluster.node_job's calls (the Role autoheal-runner-ladder-jobs): a Job created, read
    by name and deleted in the runner's namespace; refused anywhere else. tests/nodes/
    test_ladder_jobs.py runs the ladder's Jobs on real kubelets with this identity."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rbac-probe"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "fake", "command": ["true"]}],
                }
            },
        },
    }
    jobs = f"/apis/batch/v1/namespaces/{RUNNER_NS}/jobs"
    with runner_identity.http() as http:
        assert http.post(jobs, json=job).status_code == 201
        assert http.get(f"{jobs}/rbac-probe").status_code == 200
        assert http.get(f"/api/v1/namespaces/{RUNNER_NS}/pods/none/log").status_code == 404  # allowed, absent
        assert (
            http.request("DELETE", f"{jobs}/rbac-probe", json={"propagationPolicy": "Background"}).status_code
            == 200
        )
        assert http.get(jobs).status_code == 403  # no list: each Job is read by its name
        assert http.post("/apis/batch/v1/namespaces/default/jobs", json=job).status_code == 403


def test_the_granted_reads_answer(runner_identity: Identity) -> None:
    """The control for the refusals above: the same client and token are allowed what was granted."""
    with runner_identity.http() as http:
        for path in (
            "/api/v1/nodes",
            "/api/v1/pods",
            "/api/v1/nodes/gpu-2",
            "/api/v1/namespaces/default/events",
        ):
            r = http.get(path)
            assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:200]}"


def _lease_rbac_objects() -> list[dict[str, Any]]:
    """The Lease's Role and RoleBinding of a RemediationRunner with replicas (built under mocks)."""
    from components.common import SecretRef
    from components.runner import RemediationRunner, RemediationRunnerArgs, RunnerPostgresArgs
    from review.mockstack import run_program

    def program() -> dict[str, Any]:
        pg = RunnerPostgresArgs(
            url="postgresql://autoheal@db/autoheal", password=SecretRef("db", "pw", RUNNER_NS)
        )
        RemediationRunner(
            "runner", RemediationRunnerArgs(namespace=RUNNER_NS, journal="postgres", postgres=pg, replicas=2)
        )
        return {}

    objects = [dict(r.inputs) for r in run_program(program).resources]
    lease = [
        o for o in objects if o.get("kind") in ("Role", "RoleBinding") and "leader" in o["metadata"]["name"]
    ]
    assert {o["kind"] for o in lease} == {"Role", "RoleBinding"}, lease
    return lease


def test_leader_election_works_with_the_lease_role_in_its_namespace_only(
    kube_lab: Lab, runner_identity: Identity
) -> None:
    from remediation.leader import KubeLeaseAPI, LeaseElector

    kube_lab.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": _lease_rbac_objects()}),
    )

    def elector(namespace: str) -> LeaseElector:
        return LeaseElector(
            KubeLeaseAPI(runner_identity.kubeconfig, namespace, "autoheal-runner"),
            "rbac-probe",
            lease_seconds=8,
            renew_deadline_seconds=6,
            retry_seconds=1,
            on_started=lambda term: None,
            on_stopped=lambda: None,
        )

    own = elector(RUNNER_NS)

    def leads() -> bool:
        own.round()
        return own.is_leader

    wait_for(leads, 15, "the runner to take the Lease")
    own.round()  # a renewal: update
    assert own.is_leader and own.last_error == ""
    # (the lab's audit policy leaves Leases out: node heartbeats): the Lease itself says who holds it
    lease = json.loads(kube_lab.kubectl("get", "lease", "autoheal-runner", "-n", RUNNER_NS, "-o", "json"))
    assert lease["spec"]["holderIdentity"] == "rbac-probe"
    own.stop()
    other = elector("default")
    other.round()
    assert not other.is_leader and "403" in other.last_error, other.last_error

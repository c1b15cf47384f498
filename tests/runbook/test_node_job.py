"""autoheal.cluster.node_job without a cluster: Job names that fit 63 characters for any node name,
images refused unless pinned by digest, and how a finished, failed or waiting Job is read.
tests/nodes/test_ladder_jobs.py runs the Jobs on real kubelets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.runbook.conftest import plugin, run_module

nj = plugin("module_utils.node_job")
DIGEST = "registry.example.com:5000/nvidia/dcgm@sha256:" + "a" * 64
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LONG_DOTTED = "ip-10-0-3-17.us-west-2.compute.internal"


@pytest.mark.parametrize(
    "node",
    [
        "gpu-1",
        LONG_DOTTED,
        "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61,  # 253, the longest node name
        "x-" * 20 + "y",  # cut in the middle of a '-' run
    ],
)
@pytest.mark.parametrize("purpose", ["reset", "diag", "evidence"])
def test_job_names_fit_63_characters_and_are_valid_for_any_node(purpose: str, node: str) -> None:
    name = nj.job_name(purpose, node, "inc-20261203-abc:1")
    assert len(name) <= 63 and NAME_RE.fullmatch(name), name
    assert name.startswith(f"autoheal-{purpose}-")
    label = nj.node_label(node)
    assert len(label) <= 63 and nj.LABEL_VALUE_RE.fullmatch(label), label


def test_a_name_is_deterministic_and_differs_per_incident_and_node() -> None:
    a = nj.job_name("reset", LONG_DOTTED, "inc-1")
    assert a == nj.job_name("reset", LONG_DOTTED, "inc-1")  # a rerun finds the Job
    assert a.startswith("autoheal-reset-ip-10-0-3-17-")
    assert a != nj.job_name("reset", LONG_DOTTED, "inc-2")
    assert a != nj.job_name("reset", "ip-10-0-3-17.us-east-1.compute.internal", "inc-1")  # same first label
    assert nj.node_label(LONG_DOTTED) == LONG_DOTTED  # a dotted name is a label value when it fits


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        (DIGEST, True),
        ("localhost/autoheal/gpu-tools@sha256:" + "0" * 64, True),
        ("nvcr.io/nvidia/cloud-native/dcgm:3.3.5-1-ubuntu22.04", False),
        ("nvcr.io/nvidia/dcgm:4.2@sha256:" + "a" * 64, False),  # a tag beside the digest: which one runs?
        ("nvcr.io/nvidia/dcgm@sha256:abc", False),
        ("", False),
    ],
)
def test_only_references_by_digest_are_accepted(image: str, ok: bool) -> None:
    problem = nj.image_problem(image)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem.startswith("image: ") and "sha256" in problem


def test_a_tag_is_refused_by_the_module_naming_the_option_and_the_fix() -> None:
    out = run_module(
        "node_job",
        {
            "nodes": ["gpu-1"],
            "purpose": "diag",
            "image": "nvcr.io/nvidia/cloud-native/dcgm:3.3.5-1-ubuntu22.04",
            "command": ["dcgmi", "diag", "-r", "1"],
        },
    )
    assert out["failed"] and out["msg"].startswith("image: "), out
    assert "@sha256:" in out["msg"] and "monitoring.dcgmImage" in out["msg"]


def test_the_manifest_pins_the_node_allocates_gpus_and_mounts_no_token() -> None:
    p = dict(purpose="diag", image=DIGEST, command=["dcgmi", "diag"], privileged=False, timeout=900)
    p.update(namespace="autoheal", keep=False, service_account=None)
    job = nj.job_manifest(p, "autoheal-diag-x-1", LONG_DOTTED, "inc-1", 8)
    pod = job["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [LONG_DOTTED]}]}]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["automountServiceAccountToken"] is False and pod["tolerations"] == [{"operator": "Exists"}]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 900
    assert job["metadata"]["annotations"] == {
        "autoheal.io/node": LONG_DOTTED,
        "autoheal.io/incident": "inc-1",
    }


def _job(*conds: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": "True", "reason": r} for t, r in conds]}}


def _pod(phase: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p-1", "creationTimestamp": "2026-12-03T10:00:00Z"},
        "status": {"phase": phase, **status},
    }


def _exited(code: int, message: str) -> dict[str, Any]:
    return {"containerStatuses": [{"state": {"terminated": {"exitCode": code, "message": message}}}]}


def test_results_completed_failed_with_exit_code_deadline_and_running() -> None:
    done = nj.outcome(_job(("Complete", "")), [_pod("Succeeded", **_exited(0, ""))], 60)
    assert done == {"ok": True, "exit_code": 0, "reason": "Completed", "pod": "p-1"}
    failed = nj.outcome(
        _job(("Failed", "BackoffLimitExceeded")),
        [_pod("Failed", **_exited(3, "resetting\nGPU 0 is busy\n"))],
        60,
    )
    assert failed["ok"] is False and failed["exit_code"] == 3
    assert failed["reason"] == "Failed exit 3: GPU 0 is busy"
    never = nj.outcome(
        _job(("Failed", "DeadlineExceeded")),
        [
            _pod(
                "Pending",
                containerStatuses=[{"state": {"waiting": {"reason": "ErrImagePull", "message": "no"}}}],
            )
        ],
        60,
    )
    assert never["reason"] == "DeadlineExceeded: never started within 60 s: ErrImagePull: no", never
    # the controller removed the pod: no telling whether it ran, so no claim that it never did
    gone = nj.outcome(_job(("Failed", "DeadlineExceeded")), [], 60)
    assert gone["reason"].startswith("DeadlineExceeded: not finished within 60 s"), gone
    hung = nj.outcome(_job(("Failed", "DeadlineExceeded")), [_pod("Running")], 60)
    assert hung["ok"] is False and hung["reason"].startswith("DeadlineExceeded: not finished within 60 s")
    refused = nj.outcome(
        _job(("Failed", "BackoffLimitExceeded")),
        [_pod("Failed", reason="OutOfnvidia.com/gpu", message="Node didn't have enough resource")],
        60,
    )
    assert refused["reason"] == "Failed: OutOfnvidia.com/gpu: Node didn't have enough resource"
    assert nj.outcome(_job(), [_pod("Running")], 60) is None


def test_why_a_pod_waits_is_the_schedulers_message_or_the_containers_reason() -> None:
    unscheduled = _pod(
        "Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match",
            }
        ],
    )
    assert nj.pending_why(unscheduled).startswith("0/2 nodes are available: 1 Insufficient nvidia.com/gpu")
    pulling = _pod(
        "Pending",
        containerStatuses=[
            {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off\npulling"}}}
        ],
    )
    assert nj.pending_why(pulling) == "ImagePullBackOff: Back-off pulling"
    assert nj.pending_why(None).startswith("the Job created no pod")
    assert nj.is_pending([]) and nj.is_pending([unscheduled]) and not nj.is_pending([_pod("Running")])


def test_api_errors_are_one_line_reasons_and_gpus_are_checked() -> None:
    msg = 'jobs.batch is forbidden: User "system:serviceaccount:autoheal:autoheal-runner"\ncannot create'
    assert nj.api_reason(403, msg).startswith('Forbidden: jobs.batch is forbidden: User "system:')
    assert "\n" not in nj.api_reason(403, msg)
    assert [nj.gpus_problem(g) for g in (0, 4, "all", "2")] == [None] * 4
    assert all(nj.gpus_problem(g) for g in (-1, "some", True, 1.5))
    assert (
        nj.node_gpus(
            {"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "7"}}}
        )
        == 8
    )

"""Real nodes do what the runbook relies on: images run, Services and DNS work across nodes,
eviction honours preStop and the grace period, a PDB blocks an eviction, a stopped kubelet makes
its node NotReady. Every timing is measured here, against a real kubelet and containerd."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autoheal.errors import LabError
from images.recipes import RECIPES
from lab.nodes import cgroups, cluster, net, node
from tests.nodes.conftest import GPUS, Cluster, pod_spec, unique
from tests.support import wait_for

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("image", ["slurm", "runner"])
def test_a_pod_of_each_image_passes_its_check(real_cluster: Cluster, image: str) -> None:
    """slurmd -V and a munge round trip (slurm); `autoheal --version` (runner). Every pod's sandbox
    is the pause image: no other exists on the node and nothing can be pulled."""
    name = unique(f"check-{image}")
    ref = real_cluster.image(image)
    assert "@sha256:" in ref
    real_cluster.create(pod_spec(name, ref, ["/bin/sh", "-c", RECIPES[image].check], "rn-1"))
    phase = real_cluster.wait_phase(name, {"Succeeded", "Failed"}, 180)
    logs = real_cluster.logs(name)
    assert phase == "Succeeded", logs
    status = real_cluster.pod(name)["status"]["containerStatuses"][0]
    assert ref.split("@")[1] in status["imageID"] or ref.split("@")[1] in status["image"], status
    if image == "slurm":
        assert "slurm-wlm 24.11" in logs and "STATUS:          Success (0)" in logs, logs
    else:
        assert logs.strip().startswith("autoheal "), logs
    pinned = (real_cluster.ctx.paths(node.NodeSpec("rn-1", 0)).etc / "containerd.toml").read_text()
    assert f'sandbox = "{real_cluster.image("pause")}"' in pinned


def test_a_pod_on_one_node_reaches_a_service_on_another_by_dns(real_cluster: Cluster) -> None:
    web, svc, client = unique("web"), unique("svc"), unique("client")
    real_cluster.create(
        pod_spec(web, real_cluster.image("runner"), ["python3", "-m", "http.server", "8080"], "rn-2")
    )
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": svc},
            "spec": {"selector": {"test": web}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    real_cluster.wait_phase(web, {"Running"})
    fetch = (
        "import socket, time, urllib.request as u\n"
        f"host = '{svc}.default.svc.cluster.local'\n"
        "for _ in range(120):\n"
        "    try:\n"
        "        print('OK', u.urlopen(f'http://{host}/', timeout=2).status, socket.gethostbyname(host)); break\n"
        "    except Exception as e:\n"
        "        time.sleep(0.5)\n"
        "else:\n"
        "    raise SystemExit('never reached ' + host)\n"
    )
    real_cluster.create(pod_spec(client, real_cluster.image("runner"), ["python3", "-c", fetch], "rn-1"))
    assert real_cluster.wait_phase(client, {"Succeeded", "Failed"}, 180) == "Succeeded", real_cluster.logs(
        client
    )
    out = real_cluster.logs(client).split()
    cluster_ip = real_cluster.http.get(f"/api/v1/namespaces/default/services/{svc}").json()["spec"][
        "clusterIP"
    ]
    assert out[:3] == ["OK", "200", cluster_ip], out
    pods = {n: real_cluster.pod(n) for n in (web, client)}
    assert pods[web]["spec"]["nodeName"] == "rn-2" and pods[client]["spec"]["nodeName"] == "rn-1"
    lab_net = real_cluster.ctx.net
    assert pods[web]["status"]["podIP"].startswith(lab_net.pod_cidr(1).rsplit(".", 2)[0])
    assert pods[client]["status"]["podIP"].startswith(lab_net.pod_cidr(0).rsplit(".", 2)[0])


def _graceful_pod(name: str, image: str, out: Path, grace: int, term_handler: str) -> dict:
    script = (
        f"trap '{term_handler}' TERM; echo START $(date +%s.%N) >> /out/events; "
        "while true; do sleep 0.1; done"
    )
    spec = pod_spec(name, image, ["/bin/bash", "-c", script], "rn-1")
    spec["spec"]["terminationGracePeriodSeconds"] = grace
    spec["spec"]["volumes"] = [{"name": "out", "hostPath": {"path": str(out), "type": "Directory"}}]
    c = spec["spec"]["containers"][0]
    c["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    c["lifecycle"] = {
        "preStop": {
            "exec": {"command": ["/bin/sh", "-c", "echo PRESTOP $(date +%s.%N) >> /out/events; sleep 1"]}
        }
    }
    return spec


def _events(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        kind, _, ts = line.partition(" ")
        out.setdefault(kind, float(ts) if ts else 0.0)
    return out


def test_eviction_runs_prestop_then_sigterm_and_kills_only_after_the_grace_period(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """Two pods on a real node, evicted through the Eviction API at the same moment:
    - `graceful` (grace 8 s): preStop (1 s), then SIGTERM; its handler takes 5 s and exits;
    - `stubborn` (grace 3 s): preStop, then SIGTERM, which it ignores; killed at the deadline."""
    image = real_cluster.image("slurm")
    pods = {}
    for kind, grace, handler in (
        (
            "graceful",
            8,
            "echo TERM $(date +%s.%N) >> /out/events; sleep 5; echo DONE $(date +%s.%N) >> /out/events; exit 0",
        ),
        ("stubborn", 3, "echo TERM $(date +%s.%N) >> /out/events"),
    ):
        out = tmp_path / kind
        out.mkdir()
        name = unique(kind)
        pods[kind] = (name, out)
        real_cluster.create(_graceful_pod(name, image, out, grace, handler))
    for name, out in pods.values():
        real_cluster.wait_phase(name, {"Running"})
        events = out / "events"
        wait_for(events.exists, 30, "the pod to start its loop")

    def evict_and_time(name: str) -> tuple[float, float]:
        t0 = time.time()
        assert real_cluster.evict(name) == 201
        wait_for(lambda: real_cluster.pod(name) is None, 60, f"{name} to be gone", interval=0.05)
        return t0, time.time() - t0

    with ThreadPoolExecutor(2) as ex:
        timed = dict(zip(pods, ex.map(lambda k: evict_and_time(pods[k][0]), pods), strict=True))
    g0, g_took = timed["graceful"]
    g = _events(pods["graceful"][1] / "events")
    assert g["PRESTOP"] >= g0 and g["TERM"] - g["PRESTOP"] >= 1.0, g  # preStop ran first, in full
    assert 4.9 <= g["DONE"] - g["TERM"] <= 6.0, g  # its handler ran to the end: not killed early
    assert 6.0 <= g_took <= 8.0 + 4.0, g_took  # gone when it exited, within the 8 s grace
    _, s_took = timed["stubborn"]
    s = _events(pods["stubborn"][1] / "events")
    assert s["TERM"] - s["PRESTOP"] >= 1.0 and "DONE" not in s, s
    assert 3.0 <= s_took <= 3.0 + 4.0, s_took  # SIGKILL at the grace deadline, not before
    print(
        f"\n[real nodes] eviction: graceful pod gone {g_took:.1f}s after the Eviction call "
        f"(preStop 1 s + TERM handler 5 s, grace 8 s); stubborn pod killed after {s_took:.1f}s (grace 3 s)"
    )


def test_a_pdb_blocks_an_eviction(real_cluster: Cluster) -> None:
    name, pdb = unique("guarded"), unique("pdb")
    real_cluster.create(pod_spec(name, real_cluster.image("slurm"), ["sleep", "infinity"], "rn-2"))
    real_cluster.wait_phase(name, {"Running"})
    real_cluster.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": pdb},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"test": name}}},
        }
    )
    path = f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{pdb}"
    wait_for(
        lambda: real_cluster.http.get(path).json().get("status", {}).get("currentHealthy") == 1,
        60,
        "PDB status",
    )
    assert real_cluster.evict(name) == 429  # TooManyRequests: the budget allows no disruption
    assert real_cluster.phase(name) == "Running"
    assert real_cluster.http.delete(path).status_code == 200
    wait_for(lambda: real_cluster.evict(name) == 201, 30, "the eviction once the PDB is gone")


def test_the_device_plugin_advertises_gpus_hands_out_devices_and_drops_a_dead_one(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    alloc = lambda: real_cluster.node("rn-1")["status"]["allocatable"].get("nvidia.com/gpu")  # noqa: E731
    assert alloc() == str(GPUS)
    name = unique("gpu")
    spec = pod_spec(
        name,
        real_cluster.image("slurm"),
        ["/bin/sh", "-c", "ls /dev/nvidia*; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES"],
        "rn-1",
    )
    spec["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    real_cluster.create(spec)
    assert real_cluster.wait_phase(name, {"Succeeded", "Failed"}) == "Succeeded"
    logs = real_cluster.logs(name)
    assert logs.count("/dev/nvidia") == 2 and "VISIBLE=" in logs, logs
    state = real_cluster.ctx.simulator_state
    before = state.read_text()
    try:  # the simulator's state file as it writes it: XID 79 (fell off the bus) on GPU 3
        state.write_text(json.dumps({"nodes": {"rn-1": "H100"}, "xids": [["rn-1", 3, 79]]}))
        wait_for(lambda: alloc() == str(GPUS - 1), 60, "the dead GPU to leave allocatable")
        # a GPU whose series vanished (the simulator's "lost") is as gone
        state.write_text(
            json.dumps({"nodes": {"rn-1": "H100"}, "xids": [["rn-1", 3, 79]], "lost": [["rn-1", 1]]})
        )
        wait_for(lambda: alloc() == str(GPUS - 2), 60, "the vanished GPU to leave allocatable")
    finally:
        state.write_text(before)
    wait_for(lambda: alloc() == str(GPUS), 60, "the GPU to come back")


def test_a_kubelet_that_will_not_start_fails_naming_its_log_and_leaves_nothing(real_cluster: Cluster) -> None:
    run_dir = real_cluster.run_dir
    # the kubelet refuses labels in the kubernetes.io namespace it does not know, and exits
    with pytest.raises(LabError, match=r"node-rn-bad-kubelet.*exited during start.*node-rn-bad-kubelet\.log"):
        cluster.add(run_dir, "rn-bad", {"kubernetes.io/bogus": "x"}, [], 1, timeout=60)
    lab = net.lab_id(run_dir)
    assert not cgroups.pids(cgroups.node_group(lab, "rn-bad"))
    assert not any((h / cgroups.node_group(lab, "rn-bad")).exists() for h in cgroups.hierarchies(v2=True))
    assert cluster.names(run_dir) == ["rn-1", "rn-2"]  # forgotten, its index never reused
    ports = net.ip(["-j", "link", "show", "master", real_cluster.ctx.net.bridge]).stdout
    assert sorted(p["ifname"] for p in json.loads(ports)) == [real_cluster.ctx.net.veth(i) for i in (0, 1)]


def test_zz_a_node_goes_notready_when_its_kubelet_stops(real_cluster: Cluster) -> None:
    """Last: it takes a node away. The node controller marks it after its grace period (NODE_GRACE)."""
    spec = cluster.spec(real_cluster.run_dir, "rn-2")
    assert real_cluster.ready("rn-2") == "True"
    t0 = time.monotonic()
    assert node.stop_service(real_cluster.ctx, spec, "kubelet")
    wait_for(lambda: real_cluster.ready("rn-2") in ("Unknown", "False"), 120, "rn-2 NotReady", interval=1)
    print(f"\n[real nodes] rn-2 NotReady {time.monotonic() - t0:.0f}s after its kubelet stopped")
    assert real_cluster.ready("rn-1") == "True"

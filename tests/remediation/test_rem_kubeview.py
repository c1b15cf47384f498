"""RealKube with the real `kubernetes` client, against a tiny fake API server on loopback
(the reads the policy needs: nodes and pods by label selector, metadata only; the pool map cached)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from remediation.errors import KubeError
from remediation.kubeview import FakeKube, RealKube, label_is_set

NODES: dict[str, Any] = {
    "kind": "NodeList",
    "apiVersion": "v1",
    "metadata": {},
    "items": [
        {"metadata": {"name": "gpu-1", "labels": {"autoheal.io/pool": "h100"}}},
        {"metadata": {"name": "gpu-2", "labels": {"autoheal.io/opt-out": "true"}}},
        {
            "metadata": {
                "name": "gpu-5",
                "labels": {"autoheal.io/pool": "a100", "autoheal.io/opt-out": "false"},
            }
        },
        {"metadata": {"name": "gpu-6", "labels": {"autoheal.io/state": "quarantined"}}, "spec": {}},
        {
            "metadata": {"name": "gpu-7", "labels": {"autoheal.io/state": "quarantined"}},
            "spec": {"unschedulable": True},
        },
    ],
}
PODS = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {},
    "items": [
        {
            "metadata": {"name": "train", "namespace": "ml", "labels": {"autoheal.io/opt-out": "1"}},
            "spec": {"nodeName": "gpu-3", "containers": [{"name": "c"}]},
        },
        {
            "metadata": {"name": "other", "namespace": "ml", "labels": {"autoheal.io/opt-out": "no"}},
            "spec": {"nodeName": "gpu-4", "containers": [{"name": "c"}]},
        },
    ],
}


class _Api(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def do_GET(self):
        url = urlparse(self.path)
        _Api.seen.append((self.path, self.headers.get("Accept", "")))
        if url.path == "/api/v1/nodes":
            query = parse_qs(url.query)
            [selector] = query["labelSelector"]  # never the whole fleet
            key, _, value = selector.partition("=")
            items = [
                n
                for n in NODES["items"]
                if key in n["metadata"]["labels"] and (not value or n["metadata"]["labels"][key] == value)
            ]
            if query.get("fieldSelector") == ["spec.unschedulable=false"]:
                items = [n for n in items if not n.get("spec", {}).get("unschedulable")]
            body = {**NODES, "items": items}
        elif url.path == "/api/v1/pods":
            assert parse_qs(url.query)["labelSelector"] == ["autoheal.io/opt-out"]
            body = PODS
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def kubeconfig(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    yield path
    server.shutdown()
    server.server_close()


def test_real_kube_reads_labelled_nodes_metadata_only_and_opted_out_pods(kubeconfig):
    _Api.seen.clear()
    kube = RealKube(kubeconfig)
    assert kube.nodes_labelled("autoheal.io/opt-out") == {
        "gpu-2": {"autoheal.io/opt-out": "true"},
        "gpu-5": {"autoheal.io/pool": "a100", "autoheal.io/opt-out": "false"},
    }
    assert kube.nodes_with_labelled_pods("autoheal.io/opt-out") == {"gpu-3"}
    assert "PartialObjectMetadataList" in _Api.seen[0][1]


def test_real_kube_caches_the_pool_map_and_refreshes_for_an_unknown_node(kubeconfig, monkeypatch):
    import remediation.kubeview as kmod

    _Api.seen.clear()
    kube = RealKube(kubeconfig, pool_cache_seconds=60)
    assert kube.pools("autoheal.io/pool", {"gpu-1"}) == {"gpu-1": "h100", "gpu-5": "a100"}
    assert kube.pools("autoheal.io/pool", {"gpu-5"}) == {"gpu-1": "h100", "gpu-5": "a100"}
    assert len(_Api.seen) == 1  # cached
    kube.pools("autoheal.io/pool", {"gpu-9"})  # unknown, but the map is fresh: no refresh storm
    assert len(_Api.seen) == 1
    monkeypatch.setattr(kmod, "MIN_REFRESH_SECONDS", 0.0)
    kube.pools("autoheal.io/pool", {"gpu-9"})
    assert len(_Api.seen) == 2


def test_real_kube_finds_quarantined_nodes_uncordoned_by_hand(kubeconfig):
    _Api.seen.clear()
    assert RealKube(kubeconfig).uncordoned("autoheal.io/state=quarantined") == {"gpu-6"}
    assert "fieldSelector=spec.unschedulable%3Dfalse" in _Api.seen[0][0]


def test_real_kube_errors_are_kube_errors(tmp_path):
    with pytest.raises(KubeError):
        RealKube(tmp_path / "missing")
    cfg = tmp_path / "k"
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "t", "user": {}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )
    with pytest.raises(KubeError):
        RealKube(cfg, timeout_seconds=2).nodes_labelled("x")


def test_fake_kube_and_label_semantics():
    kube = FakeKube({"a": {"x": "true", "p": "h"}, "c": {}}, pods=[("b", {"x": ""})])
    assert kube.nodes_with_labelled_pods("x") == {"b"}
    assert kube.nodes_labelled("x") == {"a": {"x": "true", "p": "h"}}
    assert kube.pools("p") == {"a": "h"}
    assert label_is_set({"x": "TRUE"}, "x") and not label_is_set({"x": "False"}, "x")
    assert not label_is_set({}, "x")

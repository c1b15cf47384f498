"""How the collection's Kubernetes helper reads a kubeconfig without importing the `kubernetes`
package (token, token file, client certificate, CA data), and when it hands over to it."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runbook.conftest import COLLECTIONS, module_utils

kube = module_utils("kube")


def write(tmp: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://127.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_token_and_relative_token_file(tmp_path):
    conn = kube.simple_conn(write(tmp_path, {"token": "abc"}))
    assert conn.host == "https://127.0.0.1:6443" and conn.token == "abc"
    (tmp_path / "tok").write_text("from-file\n")
    assert kube.simple_conn(write(tmp_path, {"tokenFile": "tok"})).token == "from-file"


def test_client_certificate_data_and_ca_data_are_loaded(tmp_path):
    """The lab's own PKI: a CA and a client pair, as base64 data in the kubeconfig."""
    lab_pki = pytest.importorskip("lab.controlplane")
    pki = tmp_path / "pki"
    lab_pki.generate_pki(pki)
    b64 = {n: base64.b64encode((pki / n).read_bytes()).decode() for n in ("ca.crt", "admin.crt", "admin.key")}
    path = write(
        tmp_path,
        {"client-certificate-data": b64["admin.crt"], "client-key-data": b64["admin.key"]},
        {"server": "https://127.0.0.1:6443", "certificate-authority-data": b64["ca.crt"]},
    )
    conn = kube.simple_conn(path)
    assert conn.token is None and conn.ctx.verify_mode.name == "CERT_REQUIRED"
    assert not list(tmp_path.glob("autoheal-kube-*"))  # the temporary key file is gone


def test_exec_plugins_go_to_the_kubernetes_package_and_bad_contexts_fail(tmp_path):
    assert kube.simple_conn(write(tmp_path, {"exec": {"command": "aws"}})) is None
    with pytest.raises(ValueError, match="context 'nope' not found"):
        kube.simple_conn(write(tmp_path, {"token": "x"}), context="nope")


@pytest.mark.parametrize(
    ("user", "imported"), [({"token": "abc"}, False), ({"exec": {"command": "x"}}, True)]
)
def test_the_kubernetes_package_is_imported_only_when_needed(tmp_path, user, imported):
    """In a fresh interpreter (pytest itself may have imported it already); imported by its
    collection name, as a module does (it imports the collection's module_utils/backoff.py)."""
    path = write(tmp_path, user)
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(COLLECTIONS)!r})\n"
        "m = importlib.import_module('ansible_collections.autoheal.cluster.plugins.module_utils.kube')\n"
        f"try:\n    m.load_conn({str(path)!r})\nexcept Exception:\n    pass\n"
        "print('kubernetes' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(imported)


class _Module:
    """What Kube reads of an AnsibleModule."""

    def __init__(self, kubeconfig: Path, api_wait: float) -> None:
        self.params = {
            "kubeconfig": str(kubeconfig),
            "api_wait": api_wait,
            "request_timeout": 2,
            "workers": 1,
        }
        self.check_mode = False
        self._diff = False

    def fail_json(self, **kw: Any) -> None:
        raise AssertionError(kw)


def _json_server(answer: Callable[[str], tuple[int, Any]]) -> Any:
    """A loopback HTTP server answering each GET with `answer(path)`: (status, JSON body)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = answer(self.path)
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _api(answers: list[int]) -> tuple[Any, list[int]]:
    """A loopback HTTP server answering `answers` in turn (then 200 {}); returns it and the log."""
    seen: list[int] = []

    def answer(_path: str) -> tuple[int, Any]:
        code = answers[len(seen)] if len(seen) < len(answers) else 200
        seen.append(code)
        return code, ({"kind": "Status", "message": "not ready"} if code != 200 else {})

    return _json_server(answer), seen


def test_an_api_server_not_ready_is_waited_for_and_other_errors_are_not(tmp_path):
    """503 (an API server starting) is retried with a growing pause within api_wait; 403 at once."""
    server, seen = _api([503, 503, 403])
    try:
        cfg = write(tmp_path, {"token": "t"}, {"server": f"http://127.0.0.1:{server.server_port}"})
        k = kube.Kube(_Module(cfg, api_wait=10))
        with pytest.raises(kube.KubeError) as err:
            k.request("GET", "/api/v1/nodes/gpu-1")
        assert err.value.status == 403 and seen == [503, 503, 403] and k.api_retries == 2
        assert k.request("GET", "/api/v1/nodes/gpu-1") == {}
    finally:
        server.shutdown()
        server.server_close()


def test_an_api_server_that_never_answers_fails_after_api_wait_naming_it(tmp_path):
    server, _seen = _api([])
    port = server.server_port
    server.shutdown()
    server.server_close()  # nothing listens there now: connection refused
    cfg = write(tmp_path, {"token": "t"}, {"server": f"http://127.0.0.1:{port}"})
    k = kube.Kube(_Module(cfg, api_wait=1.2))
    with pytest.raises(kube.KubeError, match=r"over api_wait=1.2s; raise api_wait") as err:
        k.request("GET", "/api/v1/nodes/gpu-1")
    assert err.value.status == 0 and k.api_retries == 1  # paused 0.5 s; another 1 s would pass the limit


def _node_api(names: list[str], conflicts: set[str]) -> tuple[Any, list[tuple[str, str]]]:
    """A loopback API server holding `names` (a node's first patch in `conflicts` answers 409);
    returns it and the log of (method, path) it served."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    nodes = {n: {"metadata": {"name": n, "resourceVersion": "1"}, "spec": {}} for n in names}
    log: list[tuple[str, str]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            with lock:
                log.append(("GET", path))
            if path == "/api/v1/nodes":
                self._send(200, {"items": list(nodes.values())})
            elif path.rsplit("/", 1)[-1] in nodes:
                self._send(200, nodes[path.rsplit("/", 1)[-1]])
            else:
                self._send(404, {"kind": "Status", "message": "not found"})

        def do_PATCH(self) -> None:
            name = self.path.rsplit("/", 1)[-1]
            patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                log.append(("PATCH", self.path))
                if name in conflicts:
                    conflicts.discard(name)
                    self._send(409, {"kind": "Status", "message": "the object has been modified"})
                    return
                nodes[name]["spec"].update(patch.get("spec") or {})
            self._send(200, nodes[name])

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, log


def test_a_big_batch_reads_its_nodes_in_one_list_then_patches_each(tmp_path):
    """A storm's cordon: one list from the watch cache, then a patch per node (not a read and a
    patch each); a node the list lacks is read on its own, a conflict re-reads and patches again."""
    nodes_mod = module_utils("kube_nodes")
    names = [f"gpu-{i}" for i in range(1, nodes_mod.LIST_FIRST_MIN + 9)]
    server, log = _node_api(names, conflicts={"gpu-3"})
    try:
        cfg = write(tmp_path, {"token": "t"}, {"server": f"http://127.0.0.1:{server.server_port}"})
        module = _Module(cfg, api_wait=0)
        p = {
            "cordon": True,
            "cordon_owned_only": False,
            "cordon_owner_annotation": "autoheal.io/cordoned-by",
            "labels": {},
            "annotations": {},
            "node_annotations": {},
            "taints": [],
            "allow_missing": True,
        }
        result = nodes_mod.apply(module, kube.Kube(module), [*names, "gpu-gone"], p)
        assert sorted(result["changed_nodes"]) == sorted(names) and result["missing_nodes"] == ["gpu-gone"]
        reads = [path for method, path in log if method == "GET"]
        assert reads.count("/api/v1/nodes") == 1
        # per-node reads: only the node the list lacked (read uncached: is it really gone?) and the
        # conflicted one's fresh read
        assert sorted(r for r in reads if r != "/api/v1/nodes") == [
            "/api/v1/nodes/gpu-3",
            "/api/v1/nodes/gpu-gone",
        ]
        assert sum(1 for method, _ in log if method == "PATCH") == len(names) + 1  # gpu-3 twice
    finally:
        server.shutdown()
        server.server_close()


def _list_api(items: dict[str, list[dict[str, Any]]], fail: bool = False) -> tuple[Any, list[str]]:
    """A loopback API server answering the lists in `items` by path (500 to all when `fail`);
    returns it and the targets it served."""
    seen: list[str] = []

    def answer(path: str) -> tuple[int, Any]:
        seen.append(path)
        return (500, {"kind": "Status"}) if fail else (200, {"items": items[path.split("?")[0]]})

    return _json_server(answer), seen


def _pod(name: str, node: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_the_fence_reads_opt_out_in_two_lists_whatever_the_batch(tmp_path):
    """A storm's opt-out check costs two requests (labelled nodes, labelled pods), not a read and a
    pod list per node; only the batch's nodes count, and a finished pod opts nothing out."""
    from tests.runbook.conftest import plugin

    fence = plugin("modules.fence")
    label = "autoheal.io/opt-out"
    server, seen = _list_api(
        {
            "/api/v1/nodes": [{"metadata": {"name": n}} for n in ("gpu-2", "gpu-999")],
            "/api/v1/pods": [_pod("eval", "gpu-3", "Running"), _pod("done", "gpu-4", "Succeeded")],
        }
    )
    try:
        cfg = write(tmp_path, {"token": "t"}, {"server": f"http://127.0.0.1:{server.server_port}"})
        k = kube.Kube(_Module(cfg, api_wait=0))
        batch = [f"gpu-{i}" for i in range(1, 501)]
        why, unchecked = fence.opted_out(k, batch, label)
        assert why == {"gpu-2": f"node label {label}=true", "gpu-3": "pod ml/eval"} and unchecked == []
        selector = "labelSelector=autoheal.io%2Fopt-out%3Dtrue"
        assert seen == [f"/api/v1/nodes?{selector}", f"/api/v1/pods?{selector}"]
    finally:
        server.shutdown()
        server.server_close()
    failing, _ = _list_api({}, fail=True)
    try:
        cfg = write(tmp_path, {"token": "t"}, {"server": f"http://127.0.0.1:{failing.server_port}"})
        # unreadable: no node of the batch is signalled (the fence itself stands)
        assert fence.opted_out(kube.Kube(_Module(cfg, api_wait=0)), ["gpu-1", "gpu-2"], label) == (
            {},
            ["gpu-1", "gpu-2"],
        )
    finally:
        failing.shutdown()
        failing.server_close()

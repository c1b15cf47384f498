# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""A small, thread-safe Kubernetes REST helper for the autoheal.cluster modules.

Requests are plain JSON over ``http.client`` with the kubeconfig's TLS material. This keeps the
modules independent of the generated client's model classes and PATCH content-type rules, which
changed between kubernetes 30 and 37, and lets many nodes be handled concurrently from one process.

Kubeconfigs with a token or a client certificate (the common case, and the runner's in-cluster
service account) are read here: importing the ``kubernetes`` package costs ~0.3-0.5 s of CPU per
task, on the path from alert to fence. Anything else (exec plugins, auth providers) goes through
the ``kubernetes`` package's own loader.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, TypeVar
from urllib.parse import quote, urlsplit

from ansible_collections.autoheal.cluster.plugins.module_utils.backoff import Backoff

T = TypeVar("T")
R = TypeVar("R")
Obj = Dict[str, Any]  # a Kubernetes object as JSON

KUBE_COMMON_ARGS: dict[str, dict[str, Any]] = dict(
    kubeconfig=dict(type="path"),
    context=dict(type="str"),
    workers=dict(type="int", default=64),
    request_timeout=dict(type="float", default=20),
    api_wait=dict(type="float", default=60),
)
# The API server gave no answer (restart, upgrade, a control-plane node failing over) or said it
# is not ready yet: wait and try again, with a growing pause, for up to api_wait seconds. Every
# request these modules send may be sent twice: GETs, merge patches that set the same values,
# evictions (a second one of a pod already gone is a 404, which callers take as done).
UNAVAILABLE = (0, 502, 503, 504)
RETRY_FIRST_S, RETRY_CAP_S = 0.5, 4.0


class KubeError(Exception):
    """An API request failed: `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: Any) -> None:
        Exception.__init__(self, f"{status}: {message}")
        self.status = status
        self.message = message


def _unavailable(exc: BaseException) -> bool:
    """The API server gave no answer or is not ready: worth another try (see UNAVAILABLE)."""
    return isinstance(exc, KubeError) and exc.status in UNAVAILABLE


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# the user entries read here; anything else (exec plugins, auth providers) needs the kubernetes package
SIMPLE_USER_KEYS = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-key",
    "client-certificate-data",
    "client-key-data",
}


class Conn:
    """What a request needs: server URL, CA, client certificate, bearer token."""

    def __init__(
        self,
        host: str,
        ca_file: str | None = None,
        ca_data: str | None = None,
        verify: bool = True,
        cert_file: str | None = None,
        key_file: str | None = None,
        cert_data: bytes | None = None,
        key_data: bytes | None = None,
        token: str | None = None,
        authorization: str | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self.token = token
        # the Authorization header: a bearer token, or a value the kubernetes loader built whole
        self.authorization = authorization or (f"Bearer {token}" if token else None)
        ctx = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_data and key_data:
            # ssl wants files: write the pair to a private temporary file, load it, remove it
            fd, path = tempfile.mkstemp(prefix="autoheal-kube-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(cert_data + b"\n" + key_data)
                ctx.load_cert_chain(path)
            finally:
                os.unlink(path)
        elif cert_file:
            ctx.load_cert_chain(cert_file, key_file)
        self.ctx = ctx


def _b64(value: str | None) -> bytes | None:
    return base64.b64decode(value) if value else None


def _rel(base: str, path: str | None) -> str | None:
    """A kubeconfig's relative file paths are relative to the kubeconfig itself."""
    return path if not path or os.path.isabs(path) else os.path.join(os.path.dirname(base), path)


def _pick(items: Any, name: Any, key: str) -> Any:
    """The `key` mapping of the entry named `name` in a kubeconfig list, or None."""
    return next(((c.get(key) or {}) for c in items or [] if c.get("name") == name), None)


def simple_conn(path: str, context: str | None = None) -> Conn | None:
    """A Conn from a kubeconfig that uses a token or a client certificate; None when it needs the
    kubernetes package (exec plugins, auth providers, several files in KUBECONFIG)."""
    import yaml  # ansible depends on PyYAML

    with open(path) as fh:
        cfg = yaml.safe_load(fh) or {}
    name = context or cfg.get("current-context")
    ctx = _pick(cfg.get("contexts"), name, "context")
    if ctx is None:
        raise ValueError(f"context {name!r} not found in {path}")
    cluster = _pick(cfg.get("clusters"), ctx.get("cluster"), "cluster")
    user = _pick(cfg.get("users"), ctx.get("user"), "user") or {}
    if not cluster or not cluster.get("server"):
        raise ValueError(f"cluster {ctx.get('cluster')!r} of context {name!r} has no server in {path}")
    if set(user) - SIMPLE_USER_KEYS:
        return None
    token = user.get("token")
    if not token and user.get("tokenFile"):
        with open(str(_rel(path, user["tokenFile"]))) as fh:
            token = fh.read().strip()
    ca_data = _b64(cluster.get("certificate-authority-data"))
    return Conn(
        cluster["server"],
        ca_file=_rel(path, cluster.get("certificate-authority")),
        ca_data=ca_data.decode("ascii") if ca_data else None,
        verify=not cluster.get("insecure-skip-tls-verify"),
        cert_file=_rel(path, user.get("client-certificate")),
        key_file=_rel(path, user.get("client-key")),
        cert_data=_b64(user.get("client-certificate-data")),
        key_data=_b64(user.get("client-key-data")),
        token=token,
    )


def incluster_conn() -> Conn | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not os.path.isfile(os.path.join(SA_DIR, "token")):
        return None
    with open(os.path.join(SA_DIR, "token")) as fh:
        token = fh.read().strip()
    if ":" in host:
        host = f"[{host}]"
    return Conn(f"https://{host}:{port}", ca_file=os.path.join(SA_DIR, "ca.crt"), token=token)


def library_conn(kubeconfig: str | None, context: str | None) -> Conn:
    """The kubernetes package's loader, for everything simple_conn does not read."""
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

    cfg = Configuration()
    kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    # the loader stores the whole header value ("Bearer ..."), or the token and a separate prefix
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    prefix = (cfg.api_key_prefix or {}).get("authorization")
    if token and prefix:
        token = f"{prefix} {token}"
    return Conn(
        cfg.host,
        ca_file=cfg.ssl_ca_cert,
        verify=cfg.verify_ssl,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        authorization=token,
    )


def load_conn(kubeconfig: str | None = None, context: str | None = None) -> Conn:
    if not kubeconfig:
        conn = incluster_conn()
        if conn is not None:
            return conn
        env = os.environ.get("KUBECONFIG", "")
        kubeconfig = (
            env if env and os.pathsep not in env else (None if env else os.path.expanduser("~/.kube/config"))
        )
    conn = simple_conn(kubeconfig, context) if kubeconfig else None
    return conn if conn is not None else library_conn(kubeconfig, context)


class Kube:
    """Requests to the API server for one module, with a keep-alive connection per thread."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.timeout = module.params.get("request_timeout") or 20
        self.workers = max(1, module.params.get("workers") or KUBE_COMMON_ARGS["workers"]["default"])
        self.api_wait = max(0.0, float(module.params.get("api_wait") or 0))
        self.api_retries = 0  # requests sent again because the API server was away
        # 0.5 s doubling to 4 s, no jitter (as before the shared backoff); call() counts per
        # request, so the worker threads share it
        self.retry = Backoff(RETRY_FIRST_S, RETRY_CAP_S, jitter=0.0, within=self.api_wait)
        kubeconfig = module.params.get("kubeconfig")
        if kubeconfig and not os.path.isabs(kubeconfig):
            # the module's working directory is not the engineer's (the plays pass absolute paths)
            module.fail_json(msg=f"kubeconfig {kubeconfig}: give an absolute path")
        if kubeconfig and not os.path.isfile(kubeconfig):
            module.fail_json(msg=f"kubeconfig {kubeconfig} does not exist")
        try:
            conn = load_conn(kubeconfig, module.params.get("context"))
        except ImportError:
            module.fail_json(msg="the kubernetes Python package is required for this kubeconfig")
        except Exception as exc:  # any loader failure: report it, naming the kubeconfig
            module.fail_json(msg=f"cannot load the Kubernetes configuration {kubeconfig or ''}: {exc}")
        self.host = conn.host
        self.headers: dict[str, str] = {"Accept": "application/json"}
        if conn.authorization:
            self.headers["Authorization"] = conn.authorization
        self.ctx = conn.ctx
        url = urlsplit(self.host)
        self.scheme, self.netloc, self.base = url.scheme, url.netloc, url.path.rstrip("/")
        # One keep-alive connection per worker thread: a batch costs a TLS handshake per thread,
        # not per request.
        self.local = threading.local()

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self.local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            if self.scheme == "https":
                conn = http.client.HTTPSConnection(self.netloc, timeout=self.timeout, context=self.ctx)
            else:
                conn = http.client.HTTPConnection(self.netloc, timeout=self.timeout)
            self.local.conn = conn
        return conn

    def _send(
        self, method: str, target: str, data: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (0, 1):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, OSError) as exc:
                # a kept-alive connection the server closed: retry once on a fresh one
                if attempt:
                    raise KubeError(0, str(exc)) from exc
        raise AssertionError("not reached")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, Any] | None = None,
    ) -> Obj:
        raw = self.raw(method, path, body, content_type, query)
        out: Obj = json.loads(raw) if raw else {}
        return out

    def text(self, path: str, query: dict[str, Any] | None = None) -> str:
        """A GET whose answer is text, not JSON (a pod's log)."""
        return self.raw("GET", path, query=query, accept="text/plain, */*").decode("utf-8", "replace")

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, Any] | None = None,
        accept: str | None = None,
    ) -> bytes:
        target = self.base + path
        if query:
            target += "?" + "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
        data = None
        headers = dict(self.headers)
        if accept:
            headers["Accept"] = accept
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = content_type

        def once() -> bytes:
            status, raw = self._send(method, target, data, headers)
            if status >= 400:
                raise KubeError(status, _message(raw))
            return raw

        def counted(_exc: BaseException, _pause: float) -> None:
            self.api_retries += 1

        try:
            raw = self.retry.call(once, _unavailable, on_retry=counted)
        except KubeError as exc:
            if exc.status not in UNAVAILABLE:
                raise
            raise KubeError(
                exc.status,
                f"{exc.message} (the API server did not answer; tried {self.api_retries + 1} time(s)"
                f" over api_wait={self.api_wait:g}s; raise api_wait to ride out a longer outage)",
            ) from exc
        return raw

    def get_node(self, name: str, cached: bool = False) -> Obj | None:
        """The node, or None. cached=True reads the apiserver's watch cache (resourceVersion=0),
        sparing etcd a quorum read per node; only for reads whose write carries the
        resourceVersion it saw (a stale read then fails with 409 and is retried uncached)."""
        try:
            return self.request(
                "GET", "/api/v1/nodes/" + quote(name), query={"resourceVersion": "0"} if cached else None
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_nodes(self) -> dict[str, Obj]:
        """Every node by name, from the apiserver's watch cache (resourceVersion=0): a big batch's
        first read in one request instead of one per node (same trust as get_node(cached=True))."""
        out = self.request("GET", "/api/v1/nodes", query={"resourceVersion": "0"})
        return {str((n.get("metadata") or {}).get("name")): n for n in out.get("items") or []}

    def patch_node(self, name: str, patch: Obj) -> Obj:
        return self.request(
            "PATCH", "/api/v1/nodes/" + quote(name), patch, content_type="application/merge-patch+json"
        )

    def pods_on(self, node: str) -> list[Obj]:
        out = self.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"})
        return list(out.get("items") or [])

    def map(self, fn: Callable[[T], R | None], items: Iterable[T]) -> dict[T, tuple[R | None, str | None]]:
        """Run fn over items concurrently; return {item: (result, error_message)}."""
        items = list(items)

        def safe(item: T) -> tuple[T, R | None, str | None]:
            try:
                return item, fn(item), None
            except KubeError as exc:
                return item, None, str(exc)
            except Exception as exc:  # a bug must not hide the other nodes' results
                return item, None, f"{type(exc).__name__}: {exc}"

        if not items:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            return {i: (r, e) for i, r, e in pool.map(safe, items)}


def _message(raw: bytes) -> Any:
    """The API server's error message (a Status object's), else the body as text."""
    try:
        return json.loads(raw).get("message") or raw
    except (ValueError, AttributeError):
        return raw.decode("utf-8", "replace")


def node_ready(node: Obj) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def sort_results(
    names: Iterable[str], res: dict[str, tuple[R | None, str | None]]
) -> tuple[dict[str, R], list[str], dict[str, str]]:
    """Split Kube.map's results into (found {name: result}, missing names, errors {name: text}),
    in the order of `names`; a per-node function returns None for a node that does not exist."""
    found: dict[str, R] = {}
    missing: list[str] = []
    errors: dict[str, str] = {}
    for name in names:
        out, err = res[name]
        if err:
            errors[name] = err
        elif out is None:
            missing.append(name)
        else:
            found[name] = out
    return found, missing, errors

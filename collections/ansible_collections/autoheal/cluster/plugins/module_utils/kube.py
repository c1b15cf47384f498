# -*- coding: utf-8 -*-
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

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote, urlsplit

KUBE_COMMON_ARGS = dict(
    kubeconfig=dict(type="path"),
    context=dict(type="str"),
    workers=dict(type="int", default=16),
    request_timeout=dict(type="float", default=20),
)


class KubeError(Exception):
    def __init__(self, status, message):
        Exception.__init__(self, "%s: %s" % (status, message))
        self.status = status
        self.message = message


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class Conn(object):
    """What a request needs: server URL, CA, client certificate, bearer token."""

    def __init__(self, host, ca_file=None, ca_data=None, verify=True, cert_file=None, key_file=None,
                 cert_data=None, key_data=None, token=None, authorization=None):
        self.host = host.rstrip("/")
        self.token = token
        # the Authorization header: a bearer token, or a value the kubernetes loader built whole
        self.authorization = authorization or ("Bearer %s" % token if token else None)
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


def _b64(value):
    return base64.b64decode(value) if value else None


def _rel(base, path):
    return path if not path or os.path.isabs(path) else os.path.join(os.path.dirname(base), path)


def simple_conn(path, context=None):
    """A Conn from a kubeconfig that uses a token or a client certificate; None when it needs the
    kubernetes package (exec plugins, auth providers, several files in KUBECONFIG)."""
    import yaml  # ansible depends on PyYAML

    with open(path) as fh:
        cfg = yaml.safe_load(fh) or {}
    name = context or cfg.get("current-context")
    ctx = next((c.get("context") or {} for c in cfg.get("contexts") or [] if c.get("name") == name), None)
    if ctx is None:
        raise ValueError("context %r not found in %s" % (name, path))
    cluster = next((c.get("cluster") or {} for c in cfg.get("clusters") or []
                    if c.get("name") == ctx.get("cluster")), None)
    user = next((u.get("user") or {} for u in cfg.get("users") or [] if u.get("name") == ctx.get("user")), {})
    if not cluster or not cluster.get("server"):
        raise ValueError("cluster %r of context %r has no server in %s" % (ctx.get("cluster"), name, path))
    if set(user) - {"token", "tokenFile", "client-certificate", "client-key", "client-certificate-data",
                    "client-key-data"}:
        return None
    token = user.get("token")
    if not token and user.get("tokenFile"):
        with open(_rel(path, user["tokenFile"])) as fh:
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


def incluster_conn():
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not os.path.isfile(os.path.join(SA_DIR, "token")):
        return None
    with open(os.path.join(SA_DIR, "token")) as fh:
        token = fh.read().strip()
    if ":" in host:
        host = "[%s]" % host
    return Conn("https://%s:%s" % (host, port), ca_file=os.path.join(SA_DIR, "ca.crt"), token=token)


def library_conn(kubeconfig, context):
    """The kubernetes package's loader, for everything simple_conn does not read."""
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

    cfg = Configuration()
    kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    # the loader stores the whole header value ("Bearer ..."), or the token and a separate prefix
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    prefix = (cfg.api_key_prefix or {}).get("authorization")
    if token and prefix:
        token = "%s %s" % (prefix, token)
    return Conn(cfg.host, ca_file=cfg.ssl_ca_cert, verify=cfg.verify_ssl, cert_file=cfg.cert_file,
                key_file=cfg.key_file, authorization=token)


def load_conn(kubeconfig=None, context=None):
    if not kubeconfig:
        conn = incluster_conn()
        if conn is not None:
            return conn
        env = os.environ.get("KUBECONFIG", "")
        kubeconfig = env if env and os.pathsep not in env else (
            None if env else os.path.expanduser("~/.kube/config"))
    conn = simple_conn(kubeconfig, context) if kubeconfig else None
    return conn if conn is not None else library_conn(kubeconfig, context)


class Kube(object):
    def __init__(self, module):
        self.module = module
        self.timeout = module.params.get("request_timeout") or 20
        self.workers = max(1, module.params.get("workers") or 16)
        try:
            conn = load_conn(module.params.get("kubeconfig"), module.params.get("context"))
        except ImportError:
            module.fail_json(msg="the kubernetes Python package is required for this kubeconfig")
        except Exception as exc:
            module.fail_json(msg="cannot load Kubernetes configuration: %s" % exc)
        self.host = conn.host
        self.headers = {"Accept": "application/json"}
        if conn.authorization:
            self.headers["Authorization"] = conn.authorization
        self.ctx = conn.ctx
        url = urlsplit(self.host)
        self.scheme, self.netloc, self.base = url.scheme, url.netloc, url.path.rstrip("/")
        # One keep-alive connection per worker thread: a batch costs a TLS handshake per thread,
        # not per request.
        self.local = threading.local()

    def _conn(self, fresh=False):
        conn = getattr(self.local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            if self.scheme == "https":
                conn = http.client.HTTPSConnection(self.netloc, timeout=self.timeout, context=self.ctx)
            else:
                conn = http.client.HTTPConnection(self.netloc, timeout=self.timeout)
            self.local.conn = conn
        return conn

    def request(self, method, path, body=None, content_type="application/json", query=None):
        target = self.base + path
        if query:
            target += "?" + "&".join("%s=%s" % (k, quote(str(v), safe="")) for k, v in query.items())
        data = None
        headers = dict(self.headers)
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = content_type
        for attempt in (0, 1):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError) as exc:
                # a kept-alive connection the server closed: retry once on a fresh one
                if attempt:
                    raise KubeError(0, str(exc))
        if resp.status >= 400:
            try:
                msg = json.loads(raw).get("message") or raw
            except ValueError:
                msg = raw.decode("utf-8", "replace")
            raise KubeError(resp.status, msg)
        return json.loads(raw) if raw else {}

    def get_node(self, name, cached=False):
        """The node, or None. cached=True reads the apiserver's watch cache (resourceVersion=0),
        sparing etcd a quorum read per node; only for reads whose write carries the
        resourceVersion it saw (a stale read then fails with 409 and is retried uncached)."""
        try:
            return self.request("GET", "/api/v1/nodes/" + quote(name),
                                query={"resourceVersion": "0"} if cached else None)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_node(self, name, patch):
        return self.request("PATCH", "/api/v1/nodes/" + quote(name), patch,
                            content_type="application/merge-patch+json")

    def pods_on(self, node):
        out = self.request("GET", "/api/v1/pods", query={"fieldSelector": "spec.nodeName=%s" % node})
        return out.get("items") or []

    def map(self, fn, items):
        """Run fn over items concurrently; return {item: (result, error_message)}."""
        def safe(item):
            try:
                return item, fn(item), None
            except KubeError as exc:
                return item, None, str(exc)
            except Exception as exc:  # a bug must not hide the other nodes' results
                return item, None, "%s: %s" % (type(exc).__name__, exc)
        if not items:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            return dict((i, (r, e)) for i, r, e in pool.map(safe, items))


def node_ready(node):
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False

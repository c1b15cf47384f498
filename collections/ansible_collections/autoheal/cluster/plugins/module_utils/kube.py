# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""A small, thread-safe Kubernetes REST helper for the autoheal.cluster modules.

Only the kubeconfig loader of the ``kubernetes`` package is used (its interface has been stable
for years); requests are plain JSON over ``urllib`` with the loaded TLS material. This keeps the
modules independent of the generated client's model classes and PATCH content-type rules, which
changed between kubernetes 30 and 37, and lets many nodes be handled concurrently from one process.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import http.client
import json
import ssl
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


class Kube(object):
    def __init__(self, module):
        self.module = module
        self.timeout = module.params.get("request_timeout") or 20
        self.workers = max(1, module.params.get("workers") or 16)
        try:
            from kubernetes import config as kconfig
            from kubernetes.client import Configuration
        except ImportError:
            module.fail_json(msg="the kubernetes Python package is required")
        cfg = Configuration()
        kubeconfig = module.params.get("kubeconfig")
        try:
            if kubeconfig:
                kconfig.load_kube_config(config_file=kubeconfig, context=module.params.get("context"),
                                         client_configuration=cfg)
            else:
                try:
                    kconfig.load_incluster_config(client_configuration=cfg)
                except Exception:
                    kconfig.load_kube_config(context=module.params.get("context"),
                                             client_configuration=cfg)
        except Exception as exc:
            module.fail_json(msg="cannot load Kubernetes configuration: %s" % exc)
        self.host = cfg.host.rstrip("/")
        self.headers = {"Accept": "application/json"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            prefix = (cfg.api_key_prefix or {}).get("authorization")
            self.headers["Authorization"] = ("%s %s" % (prefix, token)) if prefix else token
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        self.ctx = ctx
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

    def get_node(self, name):
        try:
            return self.request("GET", "/api/v1/nodes/" + quote(name))
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

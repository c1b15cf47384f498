"""The preflight's only I/O against the cluster: GETs on the API server of a kubeconfig, with
short timeouts and no retries (an unreachable cluster fails in seconds, with its cause), and
`read_cluster`, the few reads a ClusterView is made of."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from components.config import StackSpec
from components.preflight.model import MONITORING_GROUP, ClusterView

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0


class Unreachable(Exception):
    """The API server could not be asked at all; the message is the cause."""


def kubeconfig_name(kubeconfig: str) -> str:
    """A kubeconfig as a message names it: its path, or that it was given as text."""
    return "(inline text)" if "\n" in kubeconfig else kubeconfig


class Kube:
    """GETs on the API server of a kubeconfig, as JSON, with short timeouts and no retries."""

    def __init__(
        self,
        kubeconfig: str,
        context: str | None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
    ) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if "\n" in kubeconfig:  # the kubeconfig's text (Pulumi's provider accepts either)
                config.load_kube_config_from_dict(
                    yaml.safe_load(kubeconfig),
                    context=context,
                    client_configuration=cfg,
                    persist_config=False,
                )
            else:
                if not Path(kubeconfig).is_file():
                    raise Unreachable(f"kubeconfig {kubeconfig} does not exist")
                config.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
                )
        except Unreachable:
            raise
        except Exception as exc:  # the loader's own errors: a bad file, an unknown context
            raise Unreachable(
                f"kubeconfig {kubeconfig_name(kubeconfig)}: {type(exc).__name__}: {exc}"
            ) from None
        cfg.retries = 0  # one try: a refused or silent address is reported at once, not retried
        self.host = str(cfg.host)
        self._timeout = (connect_timeout, read_timeout)
        self._api = client.ApiClient(cfg)

    def close(self) -> None:
        self._api.close()

    def get(self, path: str, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """(status, decoded body or None); Unreachable when no answer came."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._api.call_api(
                path,
                "GET",
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            body = resp.data
        except urllib3.exceptions.MaxRetryError as exc:
            raise Unreachable(_cause(exc.reason or exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(_cause(exc)) from None
        except ApiException as exc:
            if exc.status:  # an answer: 403, 404... (the caller says what it means)
                return int(exc.status), None
            # no answer: the client reports TLS failures this way (status 0)
            raise Unreachable(" ".join(str(exc.reason).split())[:300]) from None
        if resp.status != 200:
            return resp.status, None
        try:
            return resp.status, json.loads(body)
        except ValueError:
            raise Unreachable(f"{path} answered something that is not JSON: {body[:80]!r}") from None


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    for marker, said in (
        ("Connection refused", "connection refused"),
        ("timed out", "no answer (timed out)"),
        ("Name or service not known", "host name not found"),
        ("No route to host", "no route to host"),
        ("CERTIFICATE_VERIFY_FAILED", "the server's certificate is not trusted by the kubeconfig"),
    ):
        if marker in text:
            return f"{said} ({type(exc).__name__})"
    return f"{type(exc).__name__}: {text[:300]}"


def read_cluster(kube: Kube, cfg: StackSpec) -> ClusterView:
    """The reads the checks need: a few lists, each from the API server's cache."""
    denied: dict[str, str] = {}

    def listing(path: str, what: str, query: Mapping[str, str] | None = None) -> list[dict[str, Any]] | None:
        status, body = kube.get(path, {"resourceVersion": "0", **(query or {})})
        if status == 200:
            return list(body.get("items") or [])
        if status == 404:
            return None
        denied[what] = f"{status} reading {path}"
        return None

    status, version = kube.get("/version")
    if status != 200:
        raise Unreachable(f"GET /version answered {status}: {_auth_hint(status)}")
    nodes = listing("/api/v1/nodes", "nodes")
    classes = listing("/apis/storage.k8s.io/v1/storageclasses", "storageclasses")
    crds: set[str] | None = None
    prometheuses = alertmanagers = None
    namespace = None
    if cfg.monitoring.prometheus_operator:
        items = listing(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "customresourcedefinitions"
        )
        if items is not None:
            crds = {
                str(i["spec"]["names"]["plural"]) for i in items if i["spec"].get("group") == MONITORING_GROUP
            }
            if "prometheuses" in crds:
                prometheuses = listing(f"/apis/{MONITORING_GROUP}/v1/prometheuses", "prometheuses")
            if "alertmanagers" in crds:
                alertmanagers = listing(f"/apis/{MONITORING_GROUP}/v1/alertmanagers", "alertmanagers")
        status, body = kube.get(f"/api/v1/namespaces/{cfg.namespace}")
        namespace = body if status == 200 else None
    events = listing(
        "/api/v1/events", "events", {"fieldSelector": "reason=CgroupV1,involvedObject.kind=Node"}
    )
    v1 = {str(e.get("involvedObject", {}).get("name")) for e in events} if events is not None else None
    return ClusterView(
        version=version,
        nodes=nodes if nodes is not None else [],
        storage_classes=classes,
        crds=crds,
        prometheuses=prometheuses,
        alertmanagers=alertmanagers,
        namespace=namespace,
        cgroup_v1_nodes=v1,
        denied=denied,
    )


def _auth_hint(status: int) -> str:
    if status == 401:
        return "the kubeconfig's credentials were refused (expired token or certificate?): renew them"
    if status == 403:
        return "the kubeconfig's user may not read the API: use a user with read access to the cluster"
    return "not a Kubernetes API server?"

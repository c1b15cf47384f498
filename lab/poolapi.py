"""The client of the lab's pool API: the "cloud API" the node_pool and ladder roles' lab backend
calls through `autoheal lab pool ...`.

The pool controller (lab.pool) serves it on loopback for the host, and in a pods lab also on the
lab bridge for the runner's pod, where a caller must present a Kubernetes ServiceAccount token
(lab.pool checks it with a TokenReview, as IRSA or GKE Workload Identity trust a pod's identity).
The CLI reaches it either way: by lab name (loopback, from lab.json) or by `--url` and
`--token-file` (from a pod, where there is no lab.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from autoheal.errors import LabError
from lab.config import LabConfig

# seconds beyond an operation's own timeout that the call may take (the batch's answer)
SLACK = 30.0


class PoolApi:
    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @classmethod
    def of_lab(cls, cfg: LabConfig) -> PoolApi:
        return cls(cfg.url("pool_controller"))

    @classmethod
    def remote(cls, url: str, token_file: Path | None) -> PoolApi:
        if not url.startswith(("http://", "https://")):
            raise LabError(f"--url: {url!r} is not an http(s) URL of a lab's pool API")
        token = None
        if token_file is not None:
            try:
                token = token_file.read_text().strip()
            except OSError as exc:
                raise LabError(f"--token-file: cannot read {token_file}: {exc}") from exc
        return cls(url, token)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
        try:
            r = httpx.request(method, self.url + path, json=body, headers=self.headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise LabError(f"pool API {self.url}{path}: {exc}") from exc
        try:
            data = r.json()
        except ValueError:
            data = {"error": r.text[:300]}
        if r.status_code != 200:
            why = data.get("error", r.text[:300]) if isinstance(data, dict) else r.text[:300]
            raise LabError(f"pool API {path}: {r.status_code} {why}")
        return data

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self._call("GET", "/v1/pools", None, 10)
        return data

    def retire(self, node: str) -> dict[str, Any]:
        data: dict[str, Any] = self._call("POST", "/v1/retire", {"node": node}, 300)
        return data

    def ladder(self, what: str, nodes: list[str], **kw: Any) -> list[dict[str, Any]]:
        """One result per node ({item, rc, stdout, stderr}), as lab.ladder.batch returns them;
        `kw` are the operation's options (its `timeout` bounds the call, plus SLACK)."""
        wait = float(kw.get("timeout") or 60) + SLACK
        data: list[dict[str, Any]] = self._call("POST", f"/v1/ladder/{what}", {"nodes": nodes, **kw}, wait)
        return data

"""Posting to Alertmanager's v2 API: POST /api/v2/alerts with a list of alerts.

Every configured Alertmanager gets every batch (as Prometheus does with an HA pair); a batch is
delivered when at least one accepted it. A 4xx means Alertmanager refused the alerts themselves
(it will refuse them again): that is an error with the reply's text, not a retry loop in silence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from autoheal.errors import AutohealError


class PostError(AutohealError):
    """No Alertmanager accepted a batch; the message says why for each."""


class AlertmanagerClient:
    def __init__(self, urls: list[str], token_file: Path | None = None, timeout: float = 2.0) -> None:
        self.urls = [u.rstrip("/") + "/api/v2/alerts" for u in urls]
        self.token_file = token_file
        self._http = httpx.Client(timeout=timeout)

    def _headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        # read at each post: a rotated Secret takes effect without a restart
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def post(self, alerts: list[dict[str, Any]]) -> None:
        errors: list[str] = []
        for url in self.urls:
            try:
                r = self._http.post(url, json=alerts, headers=self._headers())
            except (httpx.HTTPError, OSError) as exc:
                errors.append(f"{url}: {type(exc).__name__}: {exc}"[:300])
                continue
            if r.status_code // 100 == 2:
                return
            errors.append(f"{url}: HTTP {r.status_code}: {r.text.strip()[:200]}")
        raise PostError("; ".join(errors))

    def close(self) -> None:
        self._http.close()

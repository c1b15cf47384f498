"""The HTTP face of the runner: Alertmanager's webhook, health probes and metrics.

POST /webhook answers in this order, so a bad request never has a side effect:
  401 without the bearer token (compared in constant time), 413 over the size limit,
  400 for a body that is not JSON, 422 for one that is not a valid v4 payload or holds only
  unusable alerts; then the journal commit, and only after it 200. A 500 means the transaction
  did not commit, so nothing was recorded and Alertmanager's retry is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import ValidationError as PydanticValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from remediation.auth import check_bearer
from remediation.cluster_side import ClusterSide
from remediation.committer import GroupCommitter
from remediation.config import RunnerConfig
from remediation.errors import AuthError, JournalError, PayloadError
from remediation.incidents import DeliveryResult, Intake
from remediation.journal import Journal
from remediation.leader import LeaseElector
from remediation.metrics import Metrics
from remediation.models import WebhookPayload
from remediation.notify import Notifier
from remediation.worker import Worker

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Everything the app serves from; built by remediation.runtime.build()."""

    config: RunnerConfig
    journal: Journal
    intake: Intake
    metrics: Metrics
    token: bytes
    max_body_bytes: int
    budget_limit: int
    committer: GroupCommitter
    worker: Worker | None = None
    notifier: Notifier | None = None
    # readiness of the API server and slurmctld, the cordon sync; from the config by default
    cluster: ClusterSide | None = None
    # the Lease campaign when leader election is on (the worker acts only while it leads)
    elector: LeaseElector | None = None


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_payload(body: bytes) -> WebhookPayload | tuple[int, dict[str, object]]:
    """The validated payload, or the status and body of the 4xx reply that refuses it (never
    retried by Alertmanager: the same body would fail again)."""
    try:
        return WebhookPayload.model_validate_json(body)
    except PydanticValidationError as exc:
        errors = exc.errors()
        if any(e["type"] == "json_invalid" for e in errors):
            return 400, {"error": "body is not JSON"}
        where = sorted({".".join(str(x) for x in e["loc"][:3]) for e in errors})[:5]
        return 422, {"error": "not an Alertmanager v4 payload", "fields": where}
    except RecursionError:
        return 400, {"error": "body nests too deeply"}


def _count_outcomes(metrics: Metrics, alerts: int, result: DeliveryResult) -> None:
    """What became of each alert of a delivery; the rest joined an open incident."""
    counts = {
        "incident": len(result.created),
        "unrouted": result.unrouted,
        "rejected": result.rejected,
        "resolved_unmatched": result.resolved_unmatched,
    }
    counts["joined"] = alerts - sum(counts.values())
    for outcome, n in counts.items():
        if n:
            metrics.alerts.labels(outcome=outcome).inc(n)


def create_app(rt: Runtime) -> Starlette:
    cluster = rt.cluster
    if cluster is None:
        worker = rt.worker
        cluster = ClusterSide.from_config(
            rt.config,
            leading=(lambda: worker.leading) if worker is not None else (lambda: False),
            metrics=rt.metrics,
            shortage=worker.shortage if worker is not None else None,
            notify=rt.notifier.send if rt.notifier is not None else None,
        )

    def reply(code: int, body: dict[str, object], started: float, **headers: str) -> Response:
        rt.metrics.webhook_requests.labels(code=str(code)).inc()
        rt.metrics.webhook_latency.observe(time.perf_counter() - started)
        return JSONResponse(body, status_code=code, headers=headers or None)

    async def webhook(request: Request) -> Response:
        started = time.perf_counter()
        try:
            check_bearer(request.headers.get("authorization"), rt.token)
        except AuthError:
            return reply(401, {"error": "unauthorized"}, started, **{"WWW-Authenticate": "Bearer"})
        try:
            body = await _read_body(request, rt.max_body_bytes)
        except _TooLarge:
            return reply(413, {"error": f"body larger than {rt.max_body_bytes} bytes"}, started)
        payload = _parse_payload(body)
        if not isinstance(payload, WebhookPayload):
            return reply(*payload, started)
        try:
            routed = rt.intake.route(payload)
        except PayloadError as exc:
            rt.metrics.alerts.labels(outcome="rejected").inc(len(payload.alerts))
            return reply(422, {"error": str(exc)}, started)
        try:
            result = await asyncio.wrap_future(rt.committer.submit(routed))
        except JournalError as exc:
            log.error("journal write failed, nothing recorded: %s", exc)
            return reply(500, {"error": "journal unavailable; nothing recorded"}, started)
        _count_outcomes(rt.metrics, len(payload.alerts), result)
        if rt.worker is not None and result.created:
            rt.worker.wake()
        return reply(200, {"status": "recorded", **result.as_dict()}, started)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        try:
            await run_in_threadpool(rt.journal.count_states)
        except JournalError as exc:
            return PlainTextResponse(f"journal: {exc}\n", status_code=503)
        if rt.worker is not None and not rt.worker.alive:
            return PlainTextResponse("worker stopped\n", status_code=503)
        problems = await run_in_threadpool(cluster.problems)
        if problems:  # each line names what the runner cannot reach, and why
            return PlainTextResponse("".join(f"{p}\n" for p in problems), status_code=503)
        return PlainTextResponse("ready\n")

    async def metrics(request: Request) -> Response:
        await run_in_threadpool(rt.metrics.refresh, rt.journal, rt.budget_limit)
        return Response(rt.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        rt.committer.start()
        if rt.notifier is not None:
            rt.notifier.start()
        if rt.worker is not None:
            rt.worker.start()
        if rt.elector is not None:
            rt.elector.start()
        cluster.start()
        try:
            yield
        finally:
            cluster.stop()
            if rt.elector is not None:  # hands the Lease over at once (a rolling update)
                rt.elector.stop()
            if rt.worker is not None:
                rt.worker.stop()
            if rt.notifier is not None:
                rt.notifier.stop()
            rt.committer.stop()

    return Starlette(
        routes=[
            Route("/webhook", webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
    )

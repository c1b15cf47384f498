"""The `existing` backend's Slurm as the runner's loops see it: slurmrestd (autoheal/slurmrest.py)
behind the same methods as SlurmCli, so cordon sync (its `Slurm` protocol) and the lender
(`jobs_on`, `requeue`) work on a Slurm autoheal did not deploy without knowing how it is reached.

Not wired into the loops yet (issue 34's next slice); `rest_client` builds the client from the
runner's `slurm.rest` settings."""

from __future__ import annotations

from collections.abc import Sequence

from autoheal.slurmrest import SignedToken, SlurmRest, TokenFile, TokenSource
from remediation.config import SlurmRestSettings
from remediation.cordon_sync import SlurmNode
from remediation.lending import Job, checkpoint_of


def rest_client(cfg: SlurmRestSettings) -> SlurmRest:
    """A client for `slurm.rest`: tokens from the file, or signed with slurmctld's jwt key."""
    tokens: TokenSource
    if cfg.token_file is not None:
        tokens = TokenFile(cfg.token_file)
    else:
        assert cfg.jwt_key_file is not None  # the settings hold exactly one (SlurmRestSettings)
        tokens = SignedToken(cfg.jwt_key_file, cfg.user, lifespan=cfg.token_lifespan_s)
    return SlurmRest(cfg.url, cfg.user, tokens, api_version=cfg.api_version, timeout=cfg.timeout_seconds)


class RestSlurm:
    """SlurmCli's methods (nodes, drain, resume, delete, jobs_on, requeue) over slurmrestd."""

    def __init__(self, client: SlurmRest) -> None:
        self.client = client

    def nodes(self) -> dict[str, SlurmNode]:
        return {
            name: SlurmNode(name, n.drained, n.reason, dynamic=n.dynamic, busy=n.busy, comment=n.comment)
            for name, n in self.client.nodes().items()
        }

    def drain(self, names: Sequence[str], reason: str) -> None:
        self.client.drain(names, reason)

    def resume(self, names: Sequence[str]) -> None:
        self.client.resume(names)

    def delete(self, name: str) -> None:
        self.client.delete(name)

    def jobs_on(self, node: str) -> tuple[Job, ...]:
        return tuple(Job(j.job_id, j.priority, checkpoint_of(j.comment)) for j in self.client.jobs_on(node))

    def requeue(self, job_ids: Sequence[str]) -> None:
        self.client.requeue(job_ids)

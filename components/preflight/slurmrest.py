"""The check of an existing Slurm's slurmrestd (issue 34's `existing` backend): reachable, the
token accepted by slurmctld, and a Slurm the backend supports, each row naming the setting to fix.

The rows stop at the first failure, as the cluster's own check does: a slurmrestd that does not
answer says nothing about the token, and a token refused says nothing about the nodes."""

from __future__ import annotations

from autoheal.slurmrest import (
    MIN_SLURM,
    SETTING_URL,
    SlurmRest,
    SlurmRestAuthError,
    SlurmRestError,
    SlurmRestUnreachable,
    SlurmRestVersionError,
)
from components.preflight.model import Check

MIN_TEXT = f"{MIN_SLURM[0]}.{MIN_SLURM[1]:02d}"


def check_slurmrest(client: SlurmRest) -> list[Check]:
    """The rows `slurmrestd reachable`, `slurm version`, `slurmrestd authorised`."""
    try:
        served = client.served()
    except SlurmRestUnreachable as exc:
        return [Check("slurmrestd reachable", "fail", str(exc), f"start slurmrestd or fix {exc.setting}")]
    except SlurmRestAuthError as exc:  # no token to send (its file or key unreadable), or refused
        return [Check("slurmrestd authorised", "fail", str(exc), f"fix {exc.setting}")]
    except SlurmRestError as exc:
        return [Check("slurmrestd reachable", "fail", str(exc), f"check {exc.setting or SETTING_URL}")]
    rows = [Check("slurmrestd reachable", "pass", f"{client.url} answered (Slurm {served.release})")]
    try:
        client.check()
    except SlurmRestVersionError as exc:
        return [
            *rows,
            Check(
                "slurm version",
                "fail",
                str(exc),
                f"upgrade Slurm to {MIN_TEXT} or later, or fix {exc.setting}",
            ),
        ]
    except SlurmRestAuthError as exc:
        version = Check(
            "slurm version", "pass", f"Slurm {served.release} (at least {MIN_TEXT}), API {client.api_version}"
        )
        return [*rows, version, Check("slurmrestd authorised", "fail", str(exc), f"fix {exc.setting}")]
    except SlurmRestError as exc:
        return [
            *rows,
            Check("slurmrestd authorised", "fail", str(exc), f"check {exc.setting or SETTING_URL}"),
        ]
    return [
        *rows,
        Check(
            "slurm version", "pass", f"Slurm {served.release} (at least {MIN_TEXT}), API {client.api_version}"
        ),
        Check("slurmrestd authorised", "pass", f"user {client.user!r} listed the nodes through slurmctld"),
    ]

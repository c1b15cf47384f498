"""The autoheal stack: read and validate `pulumi.Config`, then build the components.

Everything else lives in `components/`: `components.config` validates the config (errors name the
key) and fills the images it does not name from `images.lock.json` (the digests `autoheal images
build` recorded in this folder), `components.stack.build_stack` wires the components.

A `cluster.backend: kubeconfig` stack installs onto a cluster it did not build, so that cluster is
checked first (`components.preflight`, what `autoheal preflight --stack NAME` prints): a failed
check fails the preview with the report, before anything is declared.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from autoheal.errors import ConfigError
from components.config import (
    StackSpec,
    load_runner_files,
    read_image_lock,
    read_stack_config,
    with_locked_images,
)
from components.stack import build_stack


def check_cluster(cfg: StackSpec, root: Path) -> None:
    """The preflight of an existing cluster: failures stop the program, warnings are logged.
    `preflight: false` skips it (the KWOK lab's stack: its cluster runs no pods by design)."""
    if cfg.cluster.backend != "kubeconfig":
        return
    if not cfg.preflight:
        pulumi.log.info("preflight skipped: the stack sets preflight: false")
        return
    from components.preflight import preflight

    report = preflight(cfg, root, pulumi.get_stack())
    if not report.ok:
        raise pulumi.RunError(
            f"the cluster at {report.server} is not ready for this stack "
            f"(autoheal preflight --stack {pulumi.get_stack()} prints this again):\n"
            + report.text(only=("fail", "warn"))
        )
    warnings = report.text(only=("warn",))
    if warnings:
        pulumi.log.warn(f"preflight of {report.server}:\n{warnings}")


def main() -> None:
    root = Path(__file__).resolve().parent
    try:
        cfg = with_locked_images(read_stack_config(pulumi.Config().get), read_image_lock(root))
        rules_yaml, playbooks = load_runner_files(root, cfg.runner)
    except ConfigError as exc:
        # A RunError prints only the message, without a Python traceback.
        raise pulumi.RunError(str(exc)) from None
    check_cluster(cfg, root)
    build_stack(cfg, root, rules_yaml, playbooks)


main()

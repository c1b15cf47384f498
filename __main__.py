"""The autoheal stack: read and validate `pulumi.Config`, then build the components.

Everything else lives in `components/`: `components.config` validates the config (errors name the
key) and fills the images it does not name from `images.lock.json` (the digests `autoheal images
build` recorded in this folder), `components.stack.build_stack` wires the components.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from autoheal.errors import ConfigError
from components.config import load_runner_files, read_image_lock, read_stack_config, with_locked_images
from components.stack import build_stack


def main() -> None:
    root = Path(__file__).resolve().parent
    try:
        cfg = with_locked_images(read_stack_config(pulumi.Config().get), read_image_lock(root))
        rules_yaml, playbooks = load_runner_files(root, cfg.runner)
    except ConfigError as exc:
        # A RunError prints only the message, without a Python traceback.
        raise pulumi.RunError(str(exc)) from None
    build_stack(cfg, root, rules_yaml, playbooks)


main()

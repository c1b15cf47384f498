from __future__ import annotations

import pytest

from components.config import parse_stack_config
from components.stack import build_stack
from tests.components.harness import ROOT, Recorded, lab_stack_raw, run_program

LAB_PLAYBOOKS = {"gpu_fatal_xid.yml": "- hosts: localhost\n  tasks: []\n"}


@pytest.fixture(scope="package")
def lab() -> Recorded:
    """The lab stack (Pulumi.lab.yaml) built under mocks once; tests read what it declared."""
    cfg = parse_stack_config(lab_stack_raw())

    def program():
        stack = build_stack(cfg, ROOT, "rules: []\n", LAB_PLAYBOOKS)
        return {"webhook_url": stack.runner.webhook_url}

    return run_program(program)

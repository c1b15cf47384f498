"""The autoheal policy pack (`pulumi preview --policy-pack policy`): wraps `policy.rules`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

# The pack runs with its own folder as the working directory; make `policy.rules` importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy.rules import (
    STACK_RULE,
    controller_state_is_persistent,
    gpu_pool_has_spares_and_remediation,
    images_pinned_by_digest,
    login_not_open_to_the_world,
    no_wildcard_rbac,
    stack_has_remediation,
    webhook_requires_token,
)

Rule = Callable[[str, Mapping[str, Any]], list[str]]


def _resource_policy(
    name: str, description: str, rule: Rule, level: EnforcementLevel = EnforcementLevel.MANDATORY
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in rule(args.resource_type, args.props):
            report(message, args.urn)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=level,
    )


def _stack_remediation(args: StackValidationArgs, report: ReportViolation) -> None:
    for message in stack_has_remediation((r.resource_type, r.props) for r in args.resources):
        report(message, None)


PolicyPack(
    name="autoheal",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        _resource_policy(
            "gpu-pool-spares-and-remediation",
            "Every GPU pool has hot spares and automatic remediation, unless waived.",
            gpu_pool_has_spares_and_remediation,
        ),
        StackValidationPolicy(
            name=STACK_RULE,
            description="Pools that expect remediation come with a remediation runner.",
            validate=_stack_remediation,
            enforcement_level=EnforcementLevel.MANDATORY,
        ),
        _resource_policy(
            "controller-state-persistent",
            "Slurm controller state (and the runner journal) lives on a PersistentVolumeClaim.",
            controller_state_is_persistent,
        ),
        _resource_policy(
            "no-wildcard-rbac",
            "Roles list their API groups, resources and verbs; no '*'.",
            no_wildcard_rbac,
        ),
        _resource_policy(
            "webhook-requires-token",
            "Alertmanager authenticates to the runner with a token from a Secret.",
            webhook_requires_token,
        ),
        # mandatory: the stack's images default to the digests `autoheal images build` locked
        _resource_policy(
            "images-pinned-by-digest",
            "Every container image is named by digest (repo@sha256:...), never by a tag alone.",
            images_pinned_by_digest,
        ),
        _resource_policy(
            "login-source-ranges",
            "A LoadBalancer serving SSH admits listed source ranges only, never 0.0.0.0/0, unless waived.",
            login_not_open_to_the_world,
        ),
    ],
)

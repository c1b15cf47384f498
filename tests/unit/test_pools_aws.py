"""The AWS backend's pure parts: providerIDs, the scope it shares with the stack's IAM policy,
error lines (the IAM action named), botocore's retry settings, backends by name, CLI input.
Its calls to AWS are tested against moto as a server (tests/integration/test_aws_backend.py)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from autoheal.backends import POOL_BACKENDS
from autoheal.errors import ConfigError, ValidationError
from components.eks import platform
from components.nodepool import node_group_name as stack_node_group
from pools import aws, registry
from pools.aws import Instance, instance_of
from pools.base import BackendError
from pools.cli import parse_nodes, parse_options


@pytest.mark.parametrize(
    ("pid", "iid"),
    [
        ("aws:///us-east-1a/i-0123456789abcdef0", "i-0123456789abcdef0"),
        ("aws:///eu-west-3c/i-0a1b2c3d", "i-0a1b2c3d"),
    ],
)
def test_an_ec2_provider_id_names_its_instance(pid, iid):
    assert instance_of(pid) == iid


@pytest.mark.parametrize(
    "pid",
    [
        "",
        "kwok://node-1",
        "aws:///us-east-1a/",
        "aws:///us-east-1a/i-XYZ",
        "aws:///us-east-1a/i-0123; rm -rf /",
        "gce://project/zone/name",
        "aws:///us-east-1a/i-0123456789abcdef0\n",
    ],
)
def test_anything_else_is_refused_naming_the_field(pid):
    with pytest.raises(ValueError, match=r"spec\.providerID .* is not an EC2 instance's"):
        instance_of(pid)


def test_the_scope_is_the_one_the_stacks_iam_policy_grants():
    assert (aws.CLUSTER_TAG, aws.NODEGROUP_TAG) == (platform.CLUSTER_TAG, platform.NODEGROUP_TAG)
    assert aws.node_group_name("h100") == stack_node_group("h100")
    ours = {"ec2:RebootInstances", "autoscaling:TerminateInstanceInAutoScalingGroup"}
    assert ours <= set(platform.RUNNER_EC2_ACTIONS) | set(platform.RUNNER_ASG_ACTIONS)
    reads = {
        "ec2:DescribeInstances",
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeAutoScalingGroups",
    }
    assert reads <= set(platform.RUNNER_DESCRIBE_ACTIONS)


def test_out_of_scope_says_which_tags_are_wrong():
    b = aws.AwsBackend.__new__(aws.AwsBackend)  # no clients: out_of_scope reads nothing
    b.cluster = "prod"
    mine = Instance("i-1", "running", {aws.CLUSTER_TAG: "prod", aws.NODEGROUP_TAG: "autoheal-a"})
    assert b.out_of_scope(mine, "a") == ""
    assert "eks:nodegroup-name=autoheal-a, not prod/autoheal-b" in b.out_of_scope(mine, "b")
    bare = Instance("i-2", "running", {})
    assert "eks:cluster-name=(none)" in b.out_of_scope(bare, "a")
    assert Instance("i-3", "running", {}, "g", "Terminating:Wait").gone
    assert Instance("i-3", "terminated", {}).gone and not mine.gone


def client_error(code: str, op: str, retries: int = 0) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"RetryAttempts": retries}}, op
    )


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "AccessDenied", "AccessDeniedException"])
def test_access_denied_names_the_iam_action(code):
    line = aws.describe_error(client_error(code, "RebootInstances"), "ec2:RebootInstances")
    assert line.startswith("access denied: the IAM role lacks ec2:RebootInstances")


def test_throttling_says_how_many_attempts_and_other_errors_their_code():
    line = aws.describe_error(
        client_error("RequestLimitExceeded", "DescribeInstances", 7), "ec2:DescribeInstances"
    )
    assert "throttled (RequestLimitExceeded) after 8 attempts" in line and "AWS_MAX_ATTEMPTS" in line
    assert (
        aws.describe_error(client_error("InvalidParameterValue", "X"), "ec2:X")
        == "ec2:X failed: InvalidParameterValue: m"
    )
    assert "IRSA" in aws.describe_error(NoCredentialsError(), "ec2:X")


def test_retries_are_botocores_standard_mode_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    assert aws.retry_config().retries == {"mode": "standard", "total_max_attempts": aws.DEFAULT_MAX_ATTEMPTS}
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    assert aws.retry_config().retries == {"mode": "adaptive", "total_max_attempts": 3}


def test_backends_by_name():
    assert "aws" in registry.names()
    assert set(registry.BUILTIN) <= set(POOL_BACKENDS)
    with pytest.raises(ConfigError, match=r"--backend 'gcp': unknown pool backend; known: .*aws"):
        registry.factory("gcp")
    with pytest.raises(BackendError, match="needs --cluster NAME"):
        registry.backend("aws", registry.BackendOptions())


def test_cli_input_is_validated():
    assert parse_nodes("a-1, b-2,a-1") == ["a-1", "b-2"]
    with pytest.raises(ValidationError, match="--nodes"):
        parse_nodes("a-1,$(reboot)")
    with pytest.raises(ValidationError, match="--nodes: no node named"):
        parse_nodes(" , ")
    assert parse_options(["name=lab1", "root=/x=y"]) == {"name": "lab1", "root": "/x=y"}
    with pytest.raises(ValidationError, match="expected KEY=VALUE"):
        parse_options(["novalue"])

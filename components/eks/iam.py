"""IAM for an EKS stack: roles a service assumes, the cluster's OIDC provider, and IAM roles for
ServiceAccounts (IRSA: a pod's ServiceAccount token, signed by the cluster's issuer, is exchanged
for the role's credentials; the role trusts that one ServiceAccount and no other)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

STS_AUDIENCE = "sts.amazonaws.com"


@dataclass(frozen=True)
class IamRole:
    role: Any  # aws.iam.Role
    attachments: list[Any]  # aws.iam.RolePolicyAttachment


@dataclass(frozen=True)
class Oidc:
    """The cluster's OIDC provider in IAM: its ARN, and the issuer without `https://` (the prefix
    of the condition keys a trust policy tests, `<issuer>:sub`)."""

    provider_arn: pulumi.Output[str]
    issuer: pulumi.Output[str]


def service_role(
    name: str,
    service: str,
    policies: Sequence[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> IamRole:
    """An IAM role `service` may assume, with the AWS managed policies attached."""
    return _role(name, assume_role_policy(service), policies, tags, opts)


def assume_role_policy(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
        }
    )


def oidc_provider(
    name: str,
    issuer_url: pulumi.Input[str],
    thumbprints: Sequence[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> Oidc:
    """The cluster's issuer as an IAM OIDC provider. pulumi-eks fetches the issuer host's top CA
    certificate at deploy time and lists its SHA-1; IAM has since stopped using thumbprints for
    EKS issuers (it checks the certificate against its own trusted CAs) and computes one itself
    when none is given, so none is listed unless the stack names some (`oidcThumbprints`)."""
    import pulumi_aws as aws

    provider = aws.iam.OpenIdConnectProvider(
        name,
        url=issuer_url,
        client_id_lists=[STS_AUDIENCE],
        thumbprint_lists=list(thumbprints) or None,
        tags=dict(tags),
        opts=opts,
    )
    issuer = pulumi.Output.from_input(issuer_url).apply(lambda u: u.removeprefix("https://"))
    return Oidc(provider_arn=provider.arn, issuer=issuer)


def irsa_trust_policy(oidc: Oidc, namespace: pulumi.Input[str], service_account: str) -> pulumi.Output[str]:
    """Trust for exactly one ServiceAccount's tokens, issued for STS."""

    def render(args: list[str]) -> str:
        arn, issuer, ns = args
        statement = {
            "Effect": "Allow",
            "Principal": {"Federated": arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {
                "StringEquals": {
                    f"{issuer}:sub": f"system:serviceaccount:{ns}:{service_account}",
                    f"{issuer}:aud": STS_AUDIENCE,
                }
            },
        }
        return json.dumps({"Version": "2012-10-17", "Statement": [statement]}, sort_keys=True)

    return pulumi.Output.all(oidc.provider_arn, oidc.issuer, namespace).apply(render)


def irsa_role(
    name: str,
    oidc: Oidc,
    namespace: pulumi.Input[str],
    service_account: str,
    policies: Sequence[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> IamRole:
    """A role the ServiceAccount `namespace/service_account` assumes, with managed policies."""
    return _role(name, irsa_trust_policy(oidc, namespace, service_account), policies, tags, opts)


def _role(
    name: str,
    trust: pulumi.Input[str],
    policies: Sequence[str],
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> IamRole:
    import pulumi_aws as aws

    role = aws.iam.Role(name, assume_role_policy=trust, tags=dict(tags), opts=opts)
    attachments = [
        aws.iam.RolePolicyAttachment(f"{name}-{i}", role=role.name, policy_arn=arn, opts=opts)
        for i, arn in enumerate(policies)
    ]
    return IamRole(role, attachments)

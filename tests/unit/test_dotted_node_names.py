"""Node names as clouds give them (issue 33): `ip-10-0-3-17.us-west-2.compute.internal` is one
name for Kubernetes and Slurm. The lab can name its nodes so (a pool's `domain`); the names pass
every grammar the runbook checks and survive Slurm hostlists. The whole XID-79 flow on such
nodes, with real kubelets and real Slurm, is tests/k8s_slurm/test_slurm_rollout.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autoheal.names import is_node_name
from autoheal.slurmconf import SlurmPool, pool_range
from lab.config import PoolConfig
from tests.runbook.conftest import module_utils

hostlist = module_utils("hostlist")
EKS = "ip-10-0-3-17.us-west-2.compute.internal"


def test_a_pool_with_a_domain_names_its_nodes_like_a_cloud():
    pool = PoolConfig(prefix="ip-10-0-3", domain="us-west-2.compute.internal", size=2, spares=1, headroom=1)
    names = pool.slurm().node_names()
    assert names[0] == "ip-10-0-3-1.us-west-2.compute.internal"
    assert all(is_node_name(n) for n in names)
    # Slurm ranges only a trailing number: dotted names are listed one by one
    assert pool_range(pool.slurm(), names[:2]) == ",".join(names[:2])
    assert pool_range(SlurmPool("h100", "gpu", 3), ["gpu-1", "gpu-2", "gpu-3"]) == "gpu-[1-3]"


def test_a_domain_that_makes_names_too_long_for_a_label_value_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="domain: node names such as"):
        PoolConfig(prefix="ip-10-0-3", domain="a-very-long-zone-name-here.compute.internal.example")
    with pytest.raises(ValidationError, match="domain"):
        PoolConfig(domain="Bad_Domain")


def test_dotted_names_survive_the_runbooks_hostlists():
    names = [EKS, "ip-10-0-3-18.us-west-2.compute.internal"]
    assert sorted(hostlist.expand_hostlist(hostlist.compress_hostlist(names))) == sorted(names)
    assert hostlist.expand_hostlist("ip-10-0-3-[17-18].us-west-2.compute.internal") == names

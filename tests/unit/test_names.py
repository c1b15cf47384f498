import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoheal.errors import ValidationError
from autoheal.names import is_node_name, validate_node_name


@pytest.mark.parametrize("name", ["gpu-2", "a", "node-001.rack-3", "x" * 63])
def test_accepts_kubernetes_and_slurm_names(name):
    assert validate_node_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "GPU-2",
        "-gpu",
        "gpu-",
        "gpu[1-4]",
        "gpu,gpu2",
        "gpu 2",
        "$(reboot)",
        "{{ lookup('pipe','id') }}",
        "../../etc/passwd",
        "gpu-2\nState=DOWN",
        "x" * 64,
        "a..",
        None,
        7,
    ],
)
def test_rejects_hostile_or_ambiguous_names(name):
    assert not is_node_name(name)
    with pytest.raises(ValidationError, match="node"):
        validate_node_name(name)


@given(st.text(max_size=300))
def test_anything_accepted_is_shell_and_hostlist_inert(s):
    if is_node_name(s):
        assert not set(s) & set("[]{},$`'\"\\ \n\t;|&<>()*?/")

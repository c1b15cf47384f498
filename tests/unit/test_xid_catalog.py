import pytest

from autoheal.errors import ConfigError
from autoheal.xid import Tier, load_catalog, parse_catalog

NVIDIA_ACTIONABLE = [
    13,
    31,
    43,
    45,
    48,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    119,
    120,
    140,
]


def test_catalog_covers_every_xid_nvidia_documents_as_actionable():
    cat = load_catalog()
    missing = [x for x in NVIDIA_ACTIONABLE if cat.get(x) is None]
    assert missing == []


@pytest.mark.parametrize(
    ("xid", "tier"),
    [
        (79, Tier.REPLACE),
        (48, Tier.RESET),
        (64, Tier.RESET),
        (119, Tier.RESET),
        (13, Tier.NOTIFY),
        (43, Tier.NOTIFY),
    ],
)
def test_design_tiers(xid, tier):
    assert load_catalog().tier_of(xid) == tier


def test_unknown_xid_is_only_notified_never_acted_on():
    assert load_catalog().tier_of(999) == Tier.NOTIFY


def test_fatal_set_is_reset_plus_replace():
    cat = load_catalog()
    assert set(cat.fatal_xids) == set(cat.xids_of(Tier.RESET)) | set(cat.xids_of(Tier.REPLACE))
    assert 13 not in cat.fatal_xids


def test_duplicate_xid_is_a_config_error_naming_the_xid():
    data = {
        "version": 1,
        "source": "t",
        "escalation": {"repeats": 2, "window_seconds": 60},
        "xids": [
            {"xid": 79, "tier": "replace", "name": "a", "meaning": "b"},
            {"xid": 79, "tier": "reset", "name": "a", "meaning": "b"},
        ],
    }
    with pytest.raises(ConfigError, match="XID 79 is listed twice"):
        parse_catalog(data, "x.yaml")


def test_unknown_tier_is_rejected_with_the_file_name():
    data = {
        "version": 1,
        "source": "t",
        "escalation": {"repeats": 2, "window_seconds": 60},
        "xids": [{"xid": 79, "tier": "explode", "name": "a", "meaning": "b"}],
    }
    with pytest.raises(ConfigError, match=r"x\.yaml"):
        parse_catalog(data, "x.yaml")

"""The shipped XID catalogue (v4): NVIDIA's buckets mapped to the recovery ladder, decoded
messages deciding the WORKFLOW_* XIDs, and unknown XIDs failing safe."""

import pytest

from autoheal.errors import ConfigError
from autoheal.xid import Bucket, Tier, load_catalog, parse_catalog
from autoheal.xid_messages import decode

NVIDIA_ACTIONABLE = [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 140]


def test_catalog_covers_every_xid_nvidia_documents_as_actionable():
    cat = load_catalog()
    missing = [x for x in NVIDIA_ACTIONABLE if cat.get(x) is None]
    assert missing == []


@pytest.mark.parametrize(
    ("xid", "tier"),
    [
        # issue 15's side-by-side list
        (79, Tier.REBOOT),  # RESTART_BM first, not replace
        (143, Tier.RESET),  # RESET_GPU first, not replace
        (151, Tier.REBOOT),  # RESTART_VM
        (54, Tier.QUARANTINE),  # CHECK_MECHANICALS: a human
        (46, Tier.RESET),
        (110, Tier.RESET),
        (136, Tier.RESET),
        (155, Tier.RESET),
        (156, Tier.RESET),
        (158, Tier.RESET),
        (38, Tier.NOTIFY),  # over-tiered before: IGNORE
        (63, Tier.NOTIFY),
        (121, Tier.NOTIFY),
        (68, Tier.RESTART_APP),
        (69, Tier.RESTART_APP),
        (94, Tier.RESTART_APP),
        (13, Tier.RESTART_APP),
        (31, Tier.RESTART_APP),
        (32, Tier.RESTART_APP),
        (48, Tier.RESET),
        (64, Tier.RESET),
        (119, Tier.RESET),
        (43, Tier.NOTIFY),
        (167, Tier.QUARANTINE),
        (
            160,
            Tier.NOTIFY,
        ),  # Channel Retirement Event: IGNORE (was RESTART_BM: a reboot for an informational event)
    ],
)
def test_rungs_follow_nvidia(xid, tier):
    assert load_catalog().tier_of(xid) == tier


def test_unknown_xid_fails_safe_fence_and_page_never_notify():
    cat = load_catalog()
    assert cat.tier_of(999) is Tier.QUARANTINE
    res = cat.resolve(999, decode(999, "whatever"))
    assert res.tier is Tier.QUARANTINE and f"not in catalogue v{cat.version}" in res.why


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x0 (None)", Tier.NOTIFY),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", Tier.RESET),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Tier.REBOOT),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", Tier.RESET),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", Tier.RESET),
        ("mangled beyond recognition", Tier.REBOOT),  # most cautious of 154's actions
        ("", Tier.REBOOT),  # the metric path carries no message
    ],
)
def test_xid_154_follows_the_recovery_action_in_its_message(text, tier):
    assert load_catalog().resolve(154, decode(154, text)).tier is tier


@pytest.mark.parametrize("xid", range(144, 151))
def test_nvlink5_subcodes_decide_fatal_reset_nonfatal_notify_unknown_reset(xid):
    cat = load_catalog()
    fatal = decode(xid, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x0)")
    nonfatal = decode(xid, "NETIR_LINK_EVT  Nonfatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x0)")
    assert cat.resolve(xid, fatal).tier is Tier.RESET
    assert cat.resolve(xid, nonfatal).tier is Tier.NOTIFY
    assert cat.resolve(xid, decode(xid, "Link ??? broken")).tier is Tier.RESET


def test_every_bucket_maps_to_a_rung_and_fatal_means_out_of_service():
    cat = load_catalog()
    assert {e.bucket for e in cat.xids} <= set(Bucket)
    assert set(cat.fatal_xids) == {
        e.xid for e in cat.xids if e.tier in (Tier.RESET, Tier.REBOOT, Tier.REPLACE, Tier.QUARANTINE)
    }
    assert 13 not in cat.fatal_xids and 13 in cat.acting_xids
    assert 43 not in cat.acting_xids


def test_the_ladder_climbs_in_order_and_stops_at_the_top():
    assert [Tier.RESTART_APP.next_rung(), Tier.RESET.next_rung(), Tier.REBOOT.next_rung()] == [
        Tier.RESET,
        Tier.REBOOT,
        Tier.REPLACE,
    ]
    assert Tier.REPLACE.next_rung() is Tier.REPLACE and Tier.QUARANTINE.next_rung() is Tier.QUARANTINE
    assert Tier.QUARANTINE.rank > Tier.REPLACE.rank > Tier.REBOOT.rank > Tier.RESET.rank


def _data(*entries):
    return {
        "version": 1,
        "source": "t",
        "escalation": {"repeats": 2, "window_seconds": 60},
        "diagnose_on_repeat": {"xids": [13], "repeats": 2, "window_seconds": 60},
        "xids": list(entries),
    }


def test_duplicate_xid_is_a_config_error_naming_the_xid():
    data = _data(
        {"xid": 79, "bucket": "RESTART_BM", "name": "a", "meaning": "b"},
        {"xid": 79, "bucket": "RESET_GPU", "name": "a", "meaning": "b"},
    )
    with pytest.raises(ConfigError, match="XID 79 is listed twice"):
        parse_catalog(data, "x.yaml")


def test_unknown_bucket_is_rejected_with_the_file_name():
    data = _data({"xid": 79, "bucket": "EXPLODE", "name": "a", "meaning": "b"})
    with pytest.raises(ConfigError, match=r"x\.yaml"):
        parse_catalog(data, "x.yaml")

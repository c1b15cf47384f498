"""An XID in the simulator reaches a webhook through the real Prometheus and Alertmanager."""

import time

import httpx
import pytest

from lab import lab as labmod

pytestmark = pytest.mark.lab


def test_fatal_xid_reaches_the_webhook_within_5s_with_its_labels(lab, sink):
    t0 = time.time()
    labmod.inject(lab, "gpu-2", 3, 79)
    try:
        d = sink.wait_for({"Hostname": "gpu-2", "xid": "79"}, timeout=5, since=t0)
    finally:
        labmod.inject(lab, "gpu-2", None, None)
    alert = next(a for a in d.payload["alerts"] if a["labels"]["Hostname"] == "gpu-2")
    assert d.payload["version"] == "4"
    assert alert["labels"]["alertname"] == "GpuXidFatal"
    assert alert["labels"]["gpu"] == "3" and alert["labels"]["tier"] == "reboot"
    assert alert["labels"]["modelName"] == "NVIDIA H100 80GB HBM3"
    assert d.authorization.startswith("Bearer ")
    assert d.at - t0 < 5


def test_an_ignore_bucket_xid_never_alerts(lab, sink):
    # XID 63 (ECC page retirement) is NVIDIA's IGNORE bucket, tier notify: no rule fires for it.
    # (13 used to be the example; catalogue v4 gives it RESTART_APP, which alerts.)
    t0 = time.time()
    labmod.inject(lab, "gpu-3", 1, 63)
    try:
        time.sleep(4)  # several scrape + evaluation cycles at the lab's 1 s interval
        alerts = httpx.get(lab.url("prometheus", "/api/v1/alerts"), timeout=5).json()["data"]["alerts"]
        assert not [a for a in alerts if a["labels"].get("Hostname") == "gpu-3"]
        with pytest.raises(TimeoutError):
            sink.wait_for({"Hostname": "gpu-3"}, timeout=0.5, since=t0)
    finally:
        labmod.inject(lab, "gpu-3", None, None)


def test_injection_refuses_unknown_nodes_and_bad_xids(lab):
    from autoheal.errors import LabError

    with pytest.raises(LabError, match="node"):
        labmod.inject(lab, "gpu-99", 0, 79)
    with pytest.raises(LabError, match="xid"):
        labmod.inject(lab, "gpu-1", 0, -1)

"""Two sources of one fault make one incident: the XID watcher (kernel log) and the dcgm rule post
GpuXidFatal for the same node through the real Alertmanager to the runner, which opens one
incident and records who saw it and what the driver said (decoded facts, sanitised text)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import httpx
import pytest

from autoheal.kmsg import format_record
from tests.remediation.remhelp import AM_BIN
from tests.remediation.test_rem_alertmanager import alertmanager, runner  # noqa: F401 - fixtures
from tests.support import wait_for

pytestmark = [pytest.mark.timeout(120)]

BUS_3 = "0000:48:00"
UUID_3 = "GPU-00000003-1111-2222-3333-000000000003"


@pytest.fixture
def watcher(tmp_path, alertmanager):  # noqa: F811
    csv = tmp_path / "gpus.csv"
    csv.write_text(f"3, 00000000:48:00.0, {UUID_3}, NVIDIA H100 80GB HBM3\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(format_record(0, int(time.monotonic() * 1e6), "NVRM: loading NVIDIA driver"))
    log = (tmp_path / "watcher.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "watcher",
            "--node=gpu-5",
            f"--alertmanager={alertmanager.url}",
            f"--state={tmp_path / 'state.json'}",
            f"--path={kmsg}",
            f"--gpu-map=file:{csv}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield kmsg
    proc.terminate()
    proc.wait(10)


def test_watcher_and_metric_rule_make_one_incident_with_the_drivers_facts(runner, alertmanager, watcher):  # noqa: F811
    rt, _ = runner
    line = (
        f"NVRM: Xid (PCI:{BUS_3}): 154, pid=77, name=python3, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required) {{ lookup('pipe','id') }}"
    )
    with watcher.open("a") as fh:
        fh.write(format_record(1, int(time.monotonic() * 1e6), line))
    wait_for(lambda: rt.journal.alerts(), 20, "the watcher's alert at the runner")
    # the dcgm rule's alert for the same fault, as Prometheus posts it a scrape later
    dcgm = {
        "alertname": "GpuXidFatal",
        "Hostname": "gpu-5",
        "gpu": "3",
        "UUID": UUID_3,
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "instance": "10.0.0.5:9400",
        "job": "dcgm",
        "severity": "critical",
        "tier": "reset",
        "xid": "154",
        "source": "dcgm",
    }
    body = [
        {
            "labels": dcgm,
            "annotations": {"summary": "Fatal XID 154"},
            "startsAt": datetime.now(UTC).isoformat(),
        }
    ]
    assert httpx.post(f"{alertmanager.url}/api/v2/alerts", json=body, timeout=5).status_code == 200
    wait_for(lambda: len(rt.journal.alerts()) >= 2, 20, "the dcgm alert at the runner")
    [inc] = rt.journal.incidents()
    # the decoded recovery action (node reboot) decides the rung, not 154's number alone
    assert (inc.node, inc.gpu, inc.xid, inc.tier) == ("gpu-5", 3, 154, "reboot")
    sources = {json.loads(a["labels"])["source"] for a in rt.journal.alerts()}
    assert sources == {"watcher", "dcgm"}
    assert {a["incident_id"] for a in rt.journal.alerts()} == {inc.id}
    facts = [json.loads(e.detail) for e in rt.journal.timeline(inc.id) if e.phase == "alert_facts"]
    said = next(f for f in facts if f["source"] == "watcher")
    assert said["xid_recovery_action"] == "node_reboot"
    assert said["message"].startswith("GPU recovery action changed") and len(said["message"]) <= 256
    assert {"source": "dcgm"} in facts
    # the play gets typed inputs only: no alert text in what the runner stored for it
    assert "lookup" not in json.dumps(inc.extra_vars)
    assert AM_BIN


def test_forged_facts_and_hostile_text_are_dropped_or_bounded():
    from autoheal.paths import data_root
    from autoheal.xid import load_catalog
    from remediation.incidents import Incident, normalise
    from remediation.models import Alert
    from remediation.rules import load_rules

    rules = load_rules(data_root() / "config" / "rules.yaml")
    alert = Alert.model_validate(
        {
            "status": "firing",
            "labels": {
                "alertname": "GpuXidFatal",
                "Hostname": "gpu-1",
                "xid": "149",
                "source": "Evil Source!",
            },
            "annotations": {
                "xid_subcode": "{{ x }}",
                "xid_recovery_action": "reboot; rm -rf /",
                "xid_severity": "fatal",
                "xid_link": "12",
                "message": "\x1b[2J" + "y" * 4000,
            },
            "startsAt": "2026-11-30T12:00:00Z",
            "fingerprint": "abc123",
        }
    )
    rule = rules.route(dict(alert.labels))
    assert rule is not None
    inc = normalise(alert, rule, load_catalog())
    assert isinstance(inc, Incident)
    assert (inc.detail.subcode, inc.detail.recovery_action, inc.detail.severity.value, inc.detail.link) == (
        None,
        None,
        "fatal",
        12,
    )
    assert len(inc.message) <= 256 and "\x1b" not in inc.message
    assert inc.source == ""

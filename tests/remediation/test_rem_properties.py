"""Property tests: whatever arrives, the webhook answers 2xx or 4xx (never 5xx), a 4xx leaves no
trace, and only valid node names and small integers ever reach an incident."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from autoheal.names import is_node_name
from remediation.app import create_app
from remediation.kubeview import FakeKube
from remediation.runtime import build
from tests.remediation.remhelp import AUTH, alert, make_config, payload

_TMP = Path(tempfile.mkdtemp(prefix="autoheal-prop-"))
_RT = build(make_config(_TMP), kube=FakeKube(), with_worker=False)
_CLIENT = TestClient(create_app(_RT))

HOSTILE = st.sampled_from(
    [
        "{{ lookup('pipe','id') }}",
        "$(id)",
        "`id`",
        "'; DROP TABLE incidents; --",
        "\n",
        "\x00",
        "../../../etc/shadow",
        "gpu-1\r\nX: y",
        "{% for x in y %}",
        "\uff47\uff50\uff55-1",
        "a" * 1024,
    ]
)
VALUES = st.one_of(
    st.text(max_size=80), HOSTILE, st.from_regex(r"[a-z0-9]{1,10}(-[a-z0-9]{1,5})?", fullmatch=True)
)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _snapshot() -> tuple[int, int]:
    return len(_RT.journal.alerts()), len(_RT.journal.incidents())


@st.composite
def alerts(draw: st.DrawFn) -> dict:
    a = alert(
        node=draw(VALUES),
        xid=draw(st.one_of(VALUES, st.integers(0, 2000).map(str))),
        gpu=draw(st.one_of(VALUES, st.integers(-5, 100).map(str))),
        status=draw(st.sampled_from(["firing", "resolved"])),
        fingerprint=draw(st.from_regex(r"[0-9a-f]{16}", fullmatch=True)),
    )
    extra = draw(
        st.dictionaries(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True), VALUES, max_size=5)
    )
    a["labels"].update(extra)
    a["annotations"]["summary"] = draw(VALUES)
    return a


@PROPS
@given(st.lists(alerts(), min_size=1, max_size=5))
def test_any_payload_is_answered_2xx_or_4xx_and_only_valid_values_reach_incidents(batch):
    before = _snapshot()
    r = _CLIENT.post("/webhook", json=payload(*batch), headers=AUTH)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert _snapshot() == before
        return
    assert _snapshot()[0] == before[0] + len(batch)
    for iid in r.json()["created"]:
        inc = _RT.journal.incident(iid)
        assert is_node_name(inc.node)
        assert 0 < inc.xid < 1000
        assert inc.gpu is None or 0 <= inc.gpu < 64


@PROPS
@given(
    st.one_of(
        st.binary(max_size=2000),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
            max_leaves=30,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_arbitrary_bodies_never_get_5xx_and_4xx_records_nothing(body):
    before = _snapshot()
    r = _CLIENT.post("/webhook", content=body, headers=AUTH)
    assert 400 <= r.status_code < 500
    assert _snapshot() == before


@PROPS
@given(st.text(max_size=60))
def test_any_wrong_token_is_refused(token):
    before = _snapshot()
    r = _CLIENT.post("/webhook", json=payload(alert()), headers={"Authorization": token.encode("utf-8")})
    assert r.status_code == 401
    assert _snapshot() == before

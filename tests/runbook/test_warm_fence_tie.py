"""The warm fence's tie to the collection (remediation/warmfence.py -> plugins/plugin_utils/
warm_fence.py), without a lab: for the same inputs the warm path renders the fence step the play
renders, through the play's own first step, and runs the collection's module as Ansible does. The
lab tests (test_warm_fence.py) show the two fence a real cluster the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.runbook.conftest import REPO, ansible_env, in_fresh_interpreter

VENV_BIN = Path(sys.executable).parent


def inputs(tmp_path: Path) -> dict[str, Any]:
    return {
        "autoheal_nodes": ["gpu-1", "gpu-2"],
        "autoheal_incident_ids": ["inc-000000000001", "inc-000000000002"],
        "autoheal_xid": 79,
        "autoheal_gpu": 3,
        "autoheal_tier": "replace",
        "autoheal_backend": "none",
        "autoheal_journal_events": str(tmp_path / "events.jsonl"),
        "autoheal_signal_ledger": str(tmp_path / "signalled.json"),
    }


def test_the_warm_path_renders_the_fence_step_as_the_play_does(tmp_path: Path) -> None:
    """A play made of gpu_fatal_xid.yml's own first task and its fence task's arguments, rendered
    by ansible-playbook, against the warm fence's rendering of the same inputs."""
    source = yaml.safe_load((REPO / "playbooks" / "gpu_fatal_xid.yml").read_text())[0]
    first = source["tasks"][0]
    assert "autoheal.cluster.runbook_inputs" in first, first
    (fence_task,) = [t for t in source["tasks"][2]["block"] if "autoheal.cluster.fence" in t]
    fence_args = dict(fence_task["autoheal.cluster.fence"])
    fence_args.pop("opt_out_label")  # `| default(omit)`: a role's variable, absent in both
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {**source["vars"], "fence_args": fence_args},
            "tasks": [
                first,
                # rendered as a task's arguments are (omitted ones dropped), then written out
                {"ansible.builtin.set_fact": {"rendered": "{{ fence_args }}"}},
                {
                    "ansible.builtin.copy": {
                        "dest": str(tmp_path / "play.json"),
                        "content": "{{ rendered | to_json }}",
                    }
                },
            ],
        }
    ]
    shutil.copytree(REPO / "playbooks" / "specs", tmp_path / "specs")  # the first task reads it
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    extra = inputs(tmp_path)
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), str(tmp_path / "play.yml"), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ansible_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    by_play = json.loads((tmp_path / "play.json").read_text())

    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from remediation.warmfence import _Renderer\n"
        "args, run = _Renderer(Path(sys.argv[1])).args(json.loads(sys.argv[2]))\n"
        "print(json.dumps(args))\n"
    )
    (by_warm,) = in_fresh_interpreter(code, json.dumps(extra))
    by_warm.pop("opt_out_label", None)
    assert by_warm == by_play
    assert by_play["nodes"] == ["gpu-1", "gpu-2"] and by_play["signal_jobs"] == ["gpu-1", "gpu-2"]


def test_the_warm_path_runs_the_module_as_ansible_runs_it(tmp_path: Path) -> None:
    """The fence module given arguments it refuses: the warm fence's run of it (a forked child,
    the arguments in a file named on its command line) and Ansible's own answer the same."""
    args = {"nodes": ["gpu-1"], "tier": "replace", "no_such_option": 1}
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from remediation.warmfence import _Renderer, _run_module\n"
        "warm = _Renderer(Path(sys.argv[1])).warm\n"
        "print(json.dumps(_run_module(warm.FENCE_MODULE, json.loads(sys.argv[2]), 60)))\n"
    )
    (by_warm,) = in_fresh_interpreter(code, json.dumps(args))
    env = {**ansible_env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}
    res = subprocess.run(
        [
            str(VENV_BIN / "ansible"),
            "localhost",
            "-c",
            "local",
            "-m",
            "autoheal.cluster.fence",
            "-a",
            json.dumps(args),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "ANSIBLE_PYTHON_INTERPRETER": sys.executable},
        timeout=300,
    )
    start = res.stdout.find("\n{")  # the JSON callback's report, after the task timer's line
    assert start >= 0, res.stdout[-3000:] + res.stderr[-2000:]
    report, _end = json.JSONDecoder().raw_decode(res.stdout[start + 1 :])  # the timer's summary follows
    by_ansible = report["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert by_warm["failed"] and by_ansible["failed"], (by_warm, by_ansible)
    # Ansible also hands a module its own name (an internal `_ansible_module_name` argument, not
    # given on the public path), which only changes how the message names the module
    assert "no_such_option" in by_warm["msg"]
    assert by_warm["msg"].split(" module: ", 1)[1] == by_ansible["msg"].split(" module: ", 1)[1]

#!/usr/bin/env bash
# `make review`: the GitOps review of the change in this checkout. The work is done by the tested
# Python package `review/` (python -m review --help); this wrapper only gives it the lab:
#   - LAB_DIR (default .lab/default): the lab whose Kubernetes API and slurmctld the lab stack's
#     preview and the runbook's check-mode run use;
#   - the Pulumi environment of that lab (lab.pulumi_env): offline, the tools built by
#     scripts/build-tools.sh, and the lab's own state backend (LAB_DIR/pulumi), the one
#     `autoheal lab` deploys the lab stack into.
# Arguments pass through: --stack NAME, --base REF, --allow-skip CHECK, --approve NAME, --markdown FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AUTOHEAL_VENV:-$PWD/.venv}
LAB_DIR=${LAB_DIR:-$PWD/.lab/default}

# Prints `export K=V` lines for the engine, or one line naming what is missing (the review then
# reports the preview as not run, with that reason).
engine_env=$("$VENV/bin/python" - "$LAB_DIR/pulumi" <<'PY'
import shlex, sys
from pathlib import Path
from lab.controlplane import tool_bin_dir
from lab.pulumi_env import pulumi_env
try:
    env = pulumi_env(Path(sys.argv[1])) if Path(sys.argv[1]).parent.is_dir() else None
except Exception as exc:  # a tool is not built: say which
    print(f"export AUTOHEAL_REVIEW_ENGINE_MISSING={shlex.quote(str(exc))}")
    env = None
if env is None:
    print(f"export PATH={shlex.quote(str(tool_bin_dir()))}:\"$PATH\"")
else:
    for key in ("PATH", "PULUMI_BACKEND_URL", "PULUMI_HOME", "PULUMI_CONFIG_PASSPHRASE",
                "PULUMI_SKIP_UPDATE_CHECK", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION",
                "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "PULUMI_PYTHON_CMD"):
        print(f"export {key}={shlex.quote(env[key])}")
PY
)
eval "$engine_env"
export PATH="$VENV/bin:$PATH"
exec "$VENV/bin/python" -m review --lab-dir "$LAB_DIR" "$@"

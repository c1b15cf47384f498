"""A test-only image: busybox with shell scripts standing in for nvidia-smi, nv-hostengine and
dcgmi, so the recovery ladder's GPU reset and DCGM validation Jobs run for real on the lab's
kubelets (tests/nodes/test_ladder_jobs.py). Never pushed, never in images.lock.json: `build()`
knows it by name only (TEST_RECIPES), `autoheal images build` builds RECIPES.

A script's scenario is the end of the incident id the Job carries (AUTOHEAL_INCIDENT, set by
autoheal.cluster.node_job): `...-reset-fails`, `...-reset-hangs`, `...-diag-fails`,
`...-diag-hangs`; anything else succeeds. dcgmi also fails, as a real one would, when the pod was
given no GPU (the lab's device plugin sets NVIDIA_VISIBLE_DEVICES only for allocated GPUs).
"""

from __future__ import annotations

from images.oci import RuntimeConfig
from images.recipes import Recipe

BIN = "/usr/local/bin"

NVIDIA_SMI = """#!/bin/sh
echo "nvidia-smi $*"
case "$AUTOHEAL_INCIDENT" in
*-reset-fails)
  echo "Unable to reset GPU 00000000:07:00.0 because it is being used by some other process (fake)"
  exit 3;;
*-reset-hangs) exec sleep 3600;;
esac
echo "GPU 00000000:07:00.0 was successfully reset."
"""

NV_HOSTENGINE = """#!/bin/sh
echo "Started host engine version fake using socket path: /tmp/nv-hostengine"
"""

# the shape `dcgmi diag -j` prints (DCGM's JsonOutput: test_categories > tests > results)
DCGMI = """#!/bin/sh
echo "dcgmi $*" >&2
if [ -z "$NVIDIA_VISIBLE_DEVICES" ]; then
  echo "Error: no GPU is visible to this container: the diagnostic cannot run"
  exit 1
fi
status=Pass
rc=0
case "$AUTOHEAL_INCIDENT" in
*-diag-hangs) exec sleep 3600;;
*-diag-fails) status=Fail; rc=1;;
esac
printf '{"DCGM GPU Diagnostic": {"version": "fake", "test_categories": [\\n'
printf ' {"category": "Deployment", "tests": [{"name": "Denylist",'
printf ' "results": [{"gpu_ids": "%s", "status": "Pass"}]}]},\\n' "$NVIDIA_VISIBLE_DEVICES"
printf ' {"category": "Hardware", "tests": [{"name": "Memory", "results":'
printf ' [{"gpu_ids": "0", "status": "%s", "warnings": ["fake: %s"]}]}]}\\n' "$status" "$AUTOHEAL_INCIDENT"
printf ']}}\\n'
exit $rc
"""

SCRIPTS = {"nvidia-smi": NVIDIA_SMI, "nv-hostengine": NV_HOSTENGINE, "dcgmi": DCGMI}


def _install(name: str, text: str) -> str:
    """A hook writing one script into the tree (single-quoted; its own quotes escaped)."""
    quoted = text.replace("'", "'\\''")
    return f"printf '%s' '{quoted}' > \"$1\"{BIN}/{name} && chmod 0755 \"$1\"{BIN}/{name}"


# busybox-static's files only (variant extract): link the applets the scripts use
_LINKS = (
    f'set -e; cd "$1"; b=$(find . -path "*bin/busybox" -type f | head -n1); mkdir -p bin {BIN.lstrip("/")}; '
    'for a in sh sleep cat env printf; do [ -e bin/$a ] || ln -s "/${b#./}" bin/$a; done'
)

FAKE_GPU_TOOLS = Recipe(
    name="fake-gpu-tools",
    description="tests only: busybox with fake nvidia-smi, nv-hostengine and dcgmi",
    packages=("busybox-static",),
    variant="extract",
    runtime=RuntimeConfig(cmd=["/bin/sh"], env=[f"PATH={BIN}:/usr/bin:/bin"]),
    hooks=(_LINKS, *(_install(n, t) for n, t in SCRIPTS.items())),
    check="nvidia-smi -q && AUTOHEAL_INCIDENT=x-reset-fails nvidia-smi -r; [ $? = 3 ]",
)

TEST_RECIPES: dict[str, Recipe] = {FAKE_GPU_TOOLS.name: FAKE_GPU_TOOLS}

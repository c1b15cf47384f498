#!/usr/bin/env bash
# Installs everything autoheal needs on a fresh Debian machine, idempotently:
# Debian packages for the lab, the project's virtualenv, and the Go-built tools.
# A warm rerun does no work beyond a few checks (stamp files keyed on content).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${AUTOHEAL_VENV:-$ROOT/.venv}
STAMPS=$ROOT/.stamps
mkdir -p "$STAMPS"

say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }

# 1. Debian packages: only what is missing, one apt-get update at most.
APT_PKGS=(slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The virtualenv, reinstalled only when pyproject.toml changes.
PY=${PYTHON:-python3}
if [[ ! -x $VENV/bin/python ]]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
want=$(sha256sum pyproject.toml | cut -c1-16)
if [[ "$(cat "$STAMPS/venv" 2>/dev/null)" != "$want" ]]; then
  say "installing Python dependencies (first time: a few minutes)"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e ".[dev,pulumi,demo]"
  echo "$want" >"$STAMPS/venv"
fi

# 3. Go-built tools (Kubernetes control plane, KWOK, Pulumi), cached by version outside the repo.
if [[ -x scripts/build-tools.sh && "${AUTOHEAL_SKIP_TOOLS:-0}" != 1 ]]; then
  scripts/build-tools.sh
fi
say "ready"

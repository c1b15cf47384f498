#!/usr/bin/env bash
# Installs everything autoheal needs on a fresh Debian machine, idempotently: Debian packages for
# the lab, the project's virtualenv, and the Go-built tools (scripts/build-tools.sh).
#
# On a fresh machine the stages overlap where two cores allow it: Go module downloads start at
# once (network), apt runs meanwhile, then the virtualenv (uv: network, then hard links from its cache) installs
# while the Go tools compile (CPU). Each stage says what it is doing and how long it took last
# time it ran cold; the end says how long set-up took. A warm rerun does no work beyond a few
# checks (stamp files keyed on content) and takes about a second.
#
# Env: AUTOHEAL_VENV (default .venv), AUTOHEAL_SKIP_TOOLS=1 (no Go tools), PYTHON (default python3),
#      AUTOHEAL_CACHE (where build-tools.sh caches, default ~/.cache/autoheal).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${AUTOHEAL_VENV:-$ROOT/.venv}
STAMPS=$ROOT/.stamps
LOGS=$STAMPS/logs
mkdir -p "$STAMPS" "$LOGS"

# Cold durations measured on a 2-core machine of this project's kind (README, "Set-up"); the Go
# tools' own figures live in their recipes (tools/gobuild/*/recipe.sh).
COLD_APT=40
COLD_VENV=240  # uv's cache cold (the downloads) and the bytecode; warm: ~2.5 min

say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
T0=$SECONDS
declare -A TOOK=()

# ---- what is missing? ---------------------------------------------------------------------------
# mmdebstrap builds the images from Debian packages, skopeo pushes them, docker-registry is the
# registry the push test pushes to; iptables is what kube-proxy and the CNI plugins program;
# ansible-rulebook (the rulebook test) runs its rules engine on a JVM; postgresql is the server of
# the journal's PostgreSQL engine (lab/postgres.py runs private clusters of it; Debian's default
# cluster is not used).
APT_PKGS=(slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager
  mmdebstrap skopeo docker-registry iptables openjdk-17-jre-headless postgresql)
WITH_TOOLS=1
if [[ "${AUTOHEAL_SKIP_TOOLS:-0}" == 1 ]]; then WITH_TOOLS=0; fi
tools_todo=()
tools_expect=0
if ((WITH_TOOLS)); then
  mapfile -t -O "${#APT_PKGS[@]}" APT_PKGS < <(scripts/build-tools.sh --apt-packages)
  while IFS=$'\t' read -r tool _version state secs; do
    if [[ $state == build ]]; then tools_todo+=("$tool"); tools_expect=$((tools_expect + secs)); fi
  done < <(scripts/build-tools.sh --plan)
fi
apt_missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || apt_missing+=("$p")
done
PY=${PYTHON:-python3}
venv_want=$(sha256sum pyproject.toml | cut -c1-16)
venv_todo=0
if [[ ! -x $VENV/bin/python || "$(cat "$STAMPS/venv" 2>/dev/null)" != "$venv_want" ]]; then venv_todo=1; fi

if ((${#apt_missing[@]} || venv_todo || ${#tools_todo[@]})); then
  plan=()
  ((${#apt_missing[@]})) && plan+=("Debian packages (~$(mmss $COLD_APT))")
  ((venv_todo)) && plan+=("the virtualenv (~$(mmss $COLD_VENV) when uv's cache is cold)")
  ((${#tools_todo[@]})) && plan+=("Go tools ${tools_todo[*]} (~$(mmss $tools_expect) cold)")
  longest=$(( (${#apt_missing[@]} ? COLD_APT : 0) + (tools_expect > COLD_VENV ? tools_expect : (venv_todo ? COLD_VENV : 0)) ))
  say "setting up: $(IFS=';'; echo "${plan[*]}" | sed 's/;/; /g')"
  say "stages overlap; expect about $(mmss $longest) in all on 2 cores (a warm rerun: ~1 s)"
fi

# ---- 1. Go module downloads start now: they only need the network ----------------------------------
PREFETCH_PID=""
if ((${#tools_todo[@]})); then
  say "downloading Go modules in the background (log: $LOGS/go-prefetch.log)"
  scripts/build-tools.sh --prefetch --only "$(IFS=,; echo "${tools_todo[*]}")" >"$LOGS/go-prefetch.log" 2>&1 &
  PREFETCH_PID=$!
fi

# ---- 2. Debian packages: only what is missing, one apt-get update at most --------------------------
if ((${#apt_missing[@]})); then
  t=$SECONDS
  say "installing Debian packages: ${apt_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >"$LOGS/apt.log" 2>&1 || {
    say "apt-get install failed; last lines of $LOGS/apt.log:"; tail -n 20 "$LOGS/apt.log" >&2; exit 1; }
  TOOK[apt]=$((SECONDS - t))
  say "  Debian packages: done in $(mmss "${TOOK[apt]}")"
fi

# ---- 3. the virtualenv (background) and the Go tools (foreground), side by side ------------------
VENV_PID=""
if ((venv_todo)); then
  say "installing the virtualenv $VENV in the background (log: $LOGS/venv.log)"
  (
    t=$SECONDS
    [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip uv
    # uv installs from its cache (~/.cache/uv) by hard links: a fresh clone's virtualenv (6.7 GB,
    # most of it PyTorch's CUDA libraries) is linked in ~20 s where pip downloaded and unpacked it
    # for 3-4 min (pip kept no cache here; measured 2026-12-02). It compiles the bytecode as pip
    # does (~2 min of the 2.5 on a busy machine): where
    # PYTHONDONTWRITEBYTECODE is set (here it is) nothing else would, and every ansible-playbook
    # and module would compile Ansible anew (the runbook tests ran twice as long). It trusts the
    # system's CAs as pip does here, and pip's find-links; should uv fail, pip installs the same set.
    if ! UV_FIND_LINKS=${PIP_FIND_LINKS:-} "$VENV/bin/uv" pip install -q --native-tls --compile-bytecode \
        --python "$VENV/bin/python" -e ".[dev,pulumi,demo]"; then
      echo "uv failed (above); installing with pip"
      "$VENV/bin/pip" install -q -e ".[dev,pulumi,demo]"
    fi
    echo "$venv_want" >"$STAMPS/venv"
    echo $((SECONDS - t)) >"$LOGS/venv.took"
  ) >"$LOGS/venv.log" 2>&1 &
  VENV_PID=$!
fi

tools_rc=0
if ((WITH_TOOLS)); then
  t=$SECONDS
  scripts/build-tools.sh || tools_rc=$?
  ((${#tools_todo[@]})) && TOOK[tools]=$((SECONDS - t))
fi
if [[ -n $PREFETCH_PID ]]; then wait "$PREFETCH_PID" || true; fi

venv_rc=0
if [[ -n $VENV_PID ]]; then
  if kill -0 "$VENV_PID" 2>/dev/null; then say "waiting for the virtualenv install (log: $LOGS/venv.log)"; fi
  wait "$VENV_PID" || venv_rc=$?
  if ((venv_rc)); then
    say "FAILED: the virtualenv install (exit $venv_rc); last lines of $LOGS/venv.log:"
    tail -n 30 "$LOGS/venv.log" >&2
  else
    TOOK[venv]=$(cat "$LOGS/venv.took")
    say "  virtualenv: done in $(mmss "${TOOK[venv]}")"
  fi
fi
if ((tools_rc || venv_rc)); then exit 1; fi

if ((${#TOOK[@]})); then
  total=$((SECONDS - T0))
  parts=()
  for k in apt venv tools; do [[ -n ${TOOK[$k]:-} ]] && parts+=("$k $(mmss "${TOOK[$k]}")"); done
  say "set-up took $(mmss $total) ($(IFS=,; echo "${parts[*]}" | sed 's/,/, /g'); venv and tools side by side)"
  printf '%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$total" "${parts[*]}" >>"$STAMPS/bootstrap-times.tsv"
fi
say "ready"

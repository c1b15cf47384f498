#!/usr/bin/env bash
# Builds the Go tools the lab needs from Go modules (no prebuilt binary can be downloaded here).
# Each tool is a folder tools/gobuild/<tool>/ holding a wrapper module (go.mod + go.sum pin its
# exact dependency graph) and recipe.sh, which defines:
#
#   VERSION=...       cache key: ${AUTOHEAL_CACHE:-~/.cache/autoheal}/tools/<tool>-<VERSION>/
#   BINS=(...)        binaries build() leaves in $OUT, linked into ${AUTOHEAL_CACHE}/bin/
#   COLD_SECONDS=...  the last measured cold build, for progress estimates
#   APT=(...)         optional Debian build dependencies (`--apt-packages` lists them all)
#   PREPARES=(...)    optional: files (relative to $OUT) prepare() must produce; checked
#   prepare()         optional: every step that reads module files (embed files, scripts), run
#                     before build(); it must download what it reads (`moddir MODULE`)
#   build()           compiles into $OUT; cwd is $WORK, a scratch copy of the tool's folder
#
# A tool is rebuilt when its marker (a hash of every file in its folder, the Go version and
# RECIPE_REV, written last) is missing or differs, so a half build is redone; a warm run only
# hashes a few small files. Logs: ${AUTOHEAL_CACHE}/logs/<tool>-<version>.log; measured build
# times: ${AUTOHEAL_CACHE}/logs/timings.tsv. Cold, all tools, 2 cores: see README ("Set-up").
#
# Usage: build-tools.sh [--only TOOL[,TOOL]] [--prefetch | --plan | --apt-packages |
#                        --prepare-only DIR | --print-path]
#   --prefetch       download every module the selected tools need, build nothing (bootstrap runs
#                    this while apt and pip work)
#   --plan           one line per tool: name, version, cached|build, expected seconds
#   --prepare-only   run each tool's prepare() into DIR/<tool> (the cold-path test uses it with
#                    an empty GOMODCACHE)
# Env: AUTOHEAL_GO_PROCS (default 2) = go build -p; GOMODCACHE/GOCACHE keep Go's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RECIPES=${AUTOHEAL_RECIPES:-$ROOT/tools/gobuild} # override: tests only

# Build order: each line's tools may reuse the build cache the earlier ones filled.
TOOLS=(etcd kubernetes kwok pulumi pulumi-kubernetes containerd runc cni-plugins cri-tools coredns gpu-device-plugin karpenter)

CACHE=${AUTOHEAL_CACHE:-$HOME/.cache/autoheal}
TOOLS_DIR=$CACHE/tools
BIN=$CACHE/bin
LOGS=$CACHE/logs
RECIPE_REV=2 # bump to force rebuilding everything

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
GO_PROCS=${AUTOHEAL_GO_PROCS:-2}

say() { printf '\033[1m[build-tools]\033[0m %s\n' "$*" >&2; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# moddir MODULE: the directory of MODULE at the version the current wrapper pins, downloading it
# first. `go list -m -f {{.Dir}}` alone prints "" for a module not yet in the module cache, which
# only ever showed on a fresh machine.
moddir() {
  go mod download -json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

MODE=build
ONLY=""
PREP_DIR=""
while (($#)); do
  case $1 in
  --only) ONLY=",${2:?--only needs a list},"; shift ;;
  --prefetch) MODE=prefetch ;;
  --plan) MODE=plan ;;
  --apt-packages) MODE=apt ;;
  --prepare-only) MODE=prepare; PREP_DIR=${2:?--prepare-only needs a directory}; shift ;;
  --print-path) echo "$BIN"; exit 0 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  *) say "unknown option: $1 (see --help)"; exit 2 ;;
  esac
  shift
done

selected=()
for t in "${TOOLS[@]}"; do
  if [[ -z $ONLY || $ONLY == *",$t,"* ]]; then selected+=("$t"); fi
done
if [[ -n $ONLY ]]; then
  for t in ${ONLY//,/ }; do
    [[ -f $RECIPES/$t/recipe.sh ]] || { say "--only: no recipe tools/gobuild/$t/recipe.sh"; exit 2; }
  done
fi

GO_VERSION=$(go env GOVERSION)
# recipe_hash TOOL: hash of everything that decides the build of TOOL.
recipe_hash() {
  {
    echo "rev=$RECIPE_REV go=$GO_VERSION"
    (cd "$RECIPES/$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

# load TOOL: reset the recipe interface, then source the tool's recipe (call in a subshell).
load() {
  VERSION="" BINS=() APT=() PREPARES=() COLD_SECONDS=0
  unset -f prepare build
  # shellcheck source=/dev/null
  source "$RECIPES/$1/recipe.sh"
  [[ -n $VERSION && ${#BINS[@]} -gt 0 ]] && declare -F build >/dev/null || {
    say "tools/gobuild/$1/recipe.sh must set VERSION and BINS and define build()"
    exit 2
  }
}

is_cached() { # TOOL (after load): 0 when the marker matches
  local dir=$TOOLS_DIR/$1-$VERSION
  [[ -f $dir/.complete && "$(cat "$dir/.complete")" == "$(recipe_hash "$1")" ]]
}

# ---- the modes that build nothing ---------------------------------------------------------------
case $MODE in
apt)
  for t in "${selected[@]}"; do (load "$t"; ((${#APT[@]})) && printf '%s\n' "${APT[@]}" || true); done | sort -u
  exit 0
  ;;
plan)
  for t in "${selected[@]}"; do
    (load "$t"; if is_cached "$t"; then s=cached; else s=build; fi; printf '%s\t%s\t%s\t%s\n' "$t" "$VERSION" "$s" "$COLD_SECONDS")
  done
  exit 0
  ;;
prefetch)
  for t in "${selected[@]}"; do
    (load "$t"; is_cached "$t" || (cd "$RECIPES/$t" && go mod download))
  done
  exit 0
  ;;
prepare)
  for t in "${selected[@]}"; do
    (
      load "$t"
      OUT=$PREP_DIR/$t WORK=$PREP_DIR/$t/.src
      mkdir -p "$WORK"
      cp -r "$RECIPES/$t/." "$WORK/"
      cd "$WORK"
      if declare -F prepare >/dev/null; then prepare; fi
      for f in "${PREPARES[@]}"; do
        [[ -s $OUT/$f ]] || { say "$t: prepare() did not produce $f"; exit 1; }
      done
      say "$t: prepared"
    )
  done
  exit 0
  ;;
esac

# ---- build ----------------------------------------------------------------------------------------
mkdir -p "$TOOLS_DIR" "$BIN" "$LOGS"

# The progress ticker runs in the background and is always stopped; the build itself runs in the
# foreground, so Ctrl-C stops it.
TICKER=""
stop_ticker() {
  if [[ -n $TICKER ]]; then
    kill "$TICKER" 2>/dev/null || true
    wait "$TICKER" 2>/dev/null || true
    TICKER=""
  fi
}
trap stop_ticker EXIT

# run_build TOOL INDEX COUNT (after load): prepare + build into a fresh dir, marker written last.
run_build() {
  local tool=$1 i=$2 n=$3 dir=$TOOLS_DIR/$1-$VERSION start rc=0 expect=$COLD_SECONDS
  local log=$LOGS/$tool-$VERSION.log
  rm -rf "$dir"
  mkdir -p "$dir"
  start=$(date +%s)
  say "[$i/$n] $tool $VERSION: building (a cold build took ~$(mmss "$expect") here; log: $log)"
  : >"$log"
  (
    while sleep 30; do
      local el=$(($(date +%s) - start)) left
      left=$((expect - el))
      if ((left > 0)); then left="about $(mmss "$left") left"; else left="longer than the last cold build"; fi
      say "  [$i/$n] $tool: $(mmss "$el") elapsed, $left"
    done
  ) &
  TICKER=$!
  # Not `(...) || rc=$?`: errexit would be off inside, and a failed step could look fine.
  set +e
  (
    set -e
    OUT=$dir WORK=$dir/.src
    mkdir -p "$WORK"
    cp -r "$RECIPES/$tool/." "$WORK/"
    cd "$WORK"
    if declare -F prepare >/dev/null; then prepare; fi
    cd "$WORK"
    build
    rm -rf "$WORK"
  ) >>"$log" 2>&1
  rc=$?
  set -e
  stop_ticker
  local took=$(($(date +%s) - start))
  if ((rc != 0)); then
    say "FAILED: $tool $VERSION (exit $rc) after $(mmss $took); last lines of $log:"
    tail -n 40 "$log" >&2
    exit "$rc"
  fi
  recipe_hash "$tool" >"$dir/.complete"
  printf '%s\t%s\t%s\t%s\n' "$tool" "$VERSION" "$took" "$(date -u +%FT%TZ)" >>"$LOGS/timings.tsv"
  say "  [$i/$n] $tool: done in $(mmss $took)"
}

T0=$SECONDS
todo=()
expect_total=0
for t in "${selected[@]}"; do
  if ! (load "$t"; is_cached "$t"); then
    todo+=("$t")
    expect_total=$((expect_total + $(load "$t"; echo "$COLD_SECONDS")))
  fi
done
if ((${#todo[@]})); then
  say "to build: ${todo[*]} (a cold build of these took ~$(mmss $expect_total) on 2 cores)"
fi
for t in "${selected[@]}"; do
  (
    load "$t"
    if [[ " ${todo[*]} " == *" $t "* ]]; then
      run_build "$t" "$(($(printf '%s\n' "${todo[@]}" | grep -nx "$t" | cut -d: -f1)))" "${#todo[@]}"
    fi
    for name in "${BINS[@]}"; do
      target=$TOOLS_DIR/$t-$VERSION/$name
      if [[ "$(readlink "$BIN/$name" 2>/dev/null)" != "$target" ]]; then ln -sfn "$target" "$BIN/$name"; fi
    done
  )
done

env_sh="export AUTOHEAL_TOOLS_BIN=\"$BIN\"
case \":\$PATH:\" in *\":$BIN:\"*) ;; *) export PATH=\"$BIN:\$PATH\" ;; esac"
if [[ "$(cat "$TOOLS_DIR/env.sh" 2>/dev/null)" != "$env_sh" ]]; then
  echo "$env_sh" >"$TOOLS_DIR/env.sh"
fi
if ((${#todo[@]})); then
  say "tools ready in $(mmss $((SECONDS - T0))): . $TOOLS_DIR/env.sh (bin: $BIN)"
fi

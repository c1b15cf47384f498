#!/usr/bin/env bash
# Builds the Go tools the lab needs from Go modules (no prebuilt binary can be downloaded here):
# etcd, the Kubernetes control plane + kubectl, KWOK, the Pulumi CLI with a Python language host,
# and the Pulumi Kubernetes provider. Each tool is pinned by a wrapper module under
# tools/gobuild/<tool>/ (go.mod + go.sum) and cached by version outside the repo:
#
#   ${AUTOHEAL_CACHE:-~/.cache/autoheal}/tools/<tool>-<version>/   binaries + .complete marker
#   ${AUTOHEAL_CACHE:-~/.cache/autoheal}/bin/                      stable symlinks to the above
#   ${AUTOHEAL_CACHE:-~/.cache/autoheal}/tools/env.sh              `. env.sh` puts bin/ on PATH
#   ${AUTOHEAL_CACHE:-~/.cache/autoheal}/logs/<tool>.log           one log per build step
#
# The marker holds a hash of the recipe (wrapper files + this script's version line), is written
# last, and a tool is rebuilt whenever it is missing or differs, so a half build is redone.
# A warm run only hashes a few small files. Cold: ~30-45 min on 2 cores, ~1.5 GB of binaries.
#
# Options: --only TOOL[,TOOL]   build a subset (etcd,kubernetes,kwok,pulumi,pulumi-kubernetes)
#          --print-path         print the bin dir and exit
# Env:     AUTOHEAL_GO_PROCS (default 2) = go build -p; GOMODCACHE/GOCACHE keep Go's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CACHE=${AUTOHEAL_CACHE:-$HOME/.cache/autoheal}
TOOLS=$CACHE/tools
BIN=$CACHE/bin
LOGS=$CACHE/logs
RECIPE_REV=1 # bump to force rebuilding everything

ETCD_VERSION=v3.6.14
K8S_VERSION=v1.36.3
KWOK_VERSION=v0.8.0
PULUMI_VERSION=v3.274.1
# The only provider/v4 version the module proxy serves here is this pseudo-version (2026-01-15,
# between the 4.24.0 and 4.29.0 tags); the PyPI pulumi-kubernetes 4.32.0 SDK talks to it fine.
PULUMI_K8S_MODULE_VERSION=v4.0.0-20260115033456-f47bc2d6f199
PULUMI_K8S_VERSION=4.24.0-dev.20260115+f47bc2d6f199

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
GO_PROCS=${AUTOHEAL_GO_PROCS:-2}

say() { printf '\033[1m[build-tools]\033[0m %s\n' "$*" >&2; }

# moddir MODULE: the directory of MODULE (at the version the current wrapper's go.mod pins),
# downloading it first. `go list -m -f {{.Dir}}` alone prints "" for a module that is not in the
# module cache yet, which only showed on a fresh machine.
moddir() {
  go mod download -json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

if [[ ${1:-} == --print-path ]]; then
  echo "$BIN"
  exit 0
fi
ONLY=""
if [[ ${1:-} == --only ]]; then
  ONLY=",${2:?--only needs a list},"
fi

mkdir -p "$TOOLS" "$BIN" "$LOGS"

# recipe_hash TOOL: hash of everything that decides the build of TOOL.
GO_VERSION=$(go env GOVERSION)
recipe_hash() {
  local tool=$1
  {
    echo "rev=$RECIPE_REV go=$GO_VERSION"
    grep -E '^(ETCD|K8S|KWOK|PULUMI|PULUMI_K8S)(_MODULE)?_VERSION=' "$ROOT/scripts/build-tools.sh"
    find "tools/gobuild/$tool" -type f -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

# run_step NAME FUNCTION: runs FUNCTION with output to logs/NAME.log, showing progress; on failure
# prints the step, the tail of its log, and exits non-zero. The build runs in the foreground (so
# Ctrl-C stops it); only the progress ticker runs in the background, and is always stopped.
TICKER=""
stop_ticker() {
  if [[ -n $TICKER ]]; then
    kill "$TICKER" 2>/dev/null || true
    wait "$TICKER" 2>/dev/null || true
    TICKER=""
  fi
}
trap stop_ticker EXIT
run_step() {
  local name=$1 fn=$2 log=$LOGS/$1.log start rc=0
  start=$(date +%s)
  say "building $name (log: $log)"
  : >"$log"
  # 1 s sleeps, so that no sleep outlives the ticker by more than a second.
  (
    n=0
    while sleep 1; do
      n=$((n + 1))
      if ((n % 30 == 0)); then say "  $name: still building, $(($(date +%s) - start))s elapsed"; fi
    done
  ) &
  TICKER=$!
  # Not `(...) || rc=$?`: errexit would be off inside, and a failed step could look fine.
  set +e
  (
    set -e
    "$fn"
  ) >>"$log" 2>&1
  rc=$?
  set -e
  stop_ticker
  if ((rc != 0)); then
    say "FAILED: $name (exit $rc) after $(($(date +%s) - start))s; last lines of $log:"
    tail -n 40 "$log" >&2
    exit "$rc"
  fi
  say "  $name: done in $(($(date +%s) - start))s"
}

# ensure TOOL VERSION FUNCTION BIN...: builds into tools/TOOL-VERSION unless its marker matches,
# then points bin/BIN at each of the listed binaries (so finished tools are usable at once).
ensure() {
  local tool=$1 version=$2 fn=$3 want dir name
  shift 3
  if [[ -n $ONLY && $ONLY != *",$tool,"* ]]; then return 0; fi
  dir=$TOOLS/$tool-$version
  want=$(recipe_hash "$tool")
  if [[ ! -f $dir/.complete || "$(cat "$dir/.complete")" != "$want" ]]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    OUT=$dir SRC=$ROOT/tools/gobuild/$tool run_step "$tool-$version" "$fn"
    echo "$want" >"$dir/.complete"
  fi
  for name in "$@"; do
    if [[ "$(readlink "$BIN/$name" 2>/dev/null)" != "$dir/$name" ]]; then
      ln -sfn "$dir/$name" "$BIN/$name"
    fi
  done
}

build_etcd() {
  cd "$SRC"
  go build -p "$GO_PROCS" -ldflags="-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
  "$OUT/etcd" --version
}

build_kubernetes() {
  cd "$SRC"
  local minor ld="" p
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go build -p "$GO_PROCS" -tags=selinux,notest,grpcnotrace -ldflags="-s -w $ld" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  "$OUT/kube-apiserver" --version
  "$OUT/kubectl" version --client
}

build_kwok() {
  cd "$SRC"
  local ld="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
  ld+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}"
  go build -p "$GO_PROCS" -ldflags="$ld" -o "$OUT/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  "$OUT/kwok" --version
  # The stage configs the lab applies live in lab/kwok-stages (copied from this module).
}

build_pulumi() {
  cd "$SRC"
  local ld="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION"
  go build -p "$GO_PROCS" -tags=osusergo,grpcnotrace -ldflags="$ld" -o "$OUT/pulumi" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  go build -p "$GO_PROCS" -tags=osusergo,grpcnotrace \
    -ldflags="-s -w -X main.version=${PULUMI_VERSION#v}" -o "$OUT/pulumi-language-python" \
    ./cmd/pulumi-language-python
  # The executor scripts ship in the sdk/v3 module; module zips drop file modes.
  local sdk
  sdk=$(moddir github.com/pulumi/pulumi/sdk/v3)
  install -m 755 "$sdk/python/cmd/pulumi-language-python-exec" "$OUT/"
  install -m 755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$OUT/"
  "$OUT/pulumi" version
}

build_pulumi_kubernetes() {
  # Scratch copy of the wrapper plus the generated embed files the upstream main expects.
  local work=$OUT/.src mod
  rm -rf "$work"
  mkdir -p "$work"
  cp "$SRC"/go.mod "$SRC"/go.sum "$SRC"/main.go "$work/"
  cd "$work"
  mod=$(moddir github.com/pulumi/pulumi-kubernetes/provider/v4)
  python3 - "$mod/cmd/pulumi-resource-kubernetes" "$PULUMI_K8S_VERSION" <<'PY'
import json, sys
src, version = sys.argv[1], sys.argv[2]
with open(f"{src}/schema.json") as f:
    schema = json.load(f)
schema["version"] = version
with open("schema-embed.json", "w") as f:
    json.dump(schema, f, separators=(",", ":"))
with open(f"{src}/terraform-mapping.json") as f:
    mapping = json.load(f)
with open("terraform-mapping-embed.json", "w") as f:
    json.dump(mapping, f, separators=(",", ":"))
PY
  go build -p "$GO_PROCS" \
    -ldflags="-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$PULUMI_K8S_VERSION" \
    -o "$OUT/pulumi-resource-kubernetes" .
  cd "$OUT"
  rm -rf "$work"
}

T0=$SECONDS
ensure etcd "$ETCD_VERSION" build_etcd etcd
ensure kubernetes "$K8S_VERSION" build_kubernetes \
  kube-apiserver kube-controller-manager kube-scheduler kubectl
ensure kwok "$KWOK_VERSION" build_kwok kwok kwokctl
ensure pulumi "$PULUMI_VERSION" build_pulumi \
  pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python
ensure pulumi-kubernetes "$PULUMI_K8S_MODULE_VERSION" build_pulumi_kubernetes \
  pulumi-resource-kubernetes

env_sh="export AUTOHEAL_TOOLS_BIN=\"$BIN\"
case \":\$PATH:\" in *\":$BIN:\"*) ;; *) export PATH=\"$BIN:\$PATH\" ;; esac"
if [[ "$(cat "$TOOLS/env.sh" 2>/dev/null)" != "$env_sh" ]]; then
  echo "$env_sh" >"$TOOLS/env.sh"
fi
if ((SECONDS - T0 > 2)); then
  say "tools ready in $((SECONDS - T0))s: . $TOOLS/env.sh (bin: $BIN)"
fi

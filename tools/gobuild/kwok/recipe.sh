# KWOK: fake nodes for the 2,000-node scale work. The stage configs the lab applies live in
# lab/kwok-stages (copied from this module).
VERSION=v0.8.0
BINS=(kwok kwokctl)
COLD_SECONDS=119
KUBE_VERSION=v1.36.3 # what kwokctl reports as its Kubernetes version: the control plane's

build() {
  local ld="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${VERSION#v}"
  ld+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}"
  go build -p "$GO_PROCS" -ldflags="$ld" -o "$OUT/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  "$OUT/kwok" --version
}

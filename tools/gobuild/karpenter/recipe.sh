# Karpenter with its KWOK cloud provider: the real Karpenter controller (NodePools, NodeClaims,
# static capacity), whose "instances" are Nodes that the lab's KWOK runs (lab/karpenter.py).
# v1.15 asks for Go 1.26.9, newer than the toolchain here; v1.14.1 is the newest that builds.
VERSION=v1.14.1
BINS=(karpenter-kwok)
PREPARES=(crds/karpenter.sh_nodepools.yaml crds/karpenter.sh_nodeclaims.yaml crds/karpenter.kwok.sh_kwoknodeclasses.yaml)
COLD_SECONDS=315

# The CRDs this version's controller serves, next to its binary: lab/karpenter.py applies them
# from there, so they never drift from the controller. The KWOKNodeClass CRD lives apart from
# the karpenter.sh ones in the module.
prepare() {
  local mod
  mod=$(moddir sigs.k8s.io/karpenter)
  mkdir -p "$OUT/crds"
  cp "$mod"/kwok/charts/crds/karpenter.sh_*.yaml "$mod"/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml "$OUT/crds/"
  chmod u+w "$OUT"/crds/*.yaml
}

build() {
  go build -p "$GO_PROCS" -ldflags="-s -w" -o "$OUT/karpenter-kwok" sigs.k8s.io/karpenter/kwok
}

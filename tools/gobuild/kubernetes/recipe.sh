# The Kubernetes control plane and kubectl. k8s.io/kubernetes replaces its staging modules with
# ./staging folders, so `go install` is refused: the wrapper's go.mod replaces each with the
# published v0.<minor>.<patch>. Version strings are set with -X (else binaries say v0.0.0-master).
VERSION=v1.36.3
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
COLD_SECONDS=502

build() {
  local minor ld="" p
  minor=$(echo "$VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go build -p "$GO_PROCS" -tags=selinux,notest,grpcnotrace -ldflags="-s -w $ld" -o "$OUT/" \
    "${BINS[@]/#/k8s.io/kubernetes/cmd/}"
  "$OUT/kube-apiserver" --version
  "$OUT/kubectl" version --client
}

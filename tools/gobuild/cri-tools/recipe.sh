# crictl: talks CRI to a lab node's containerd (images, pods, containers, logs) when debugging.
VERSION=v1.37.0
BINS=(crictl)
COLD_SECONDS=33

build() {
  go build -p "$GO_PROCS" -ldflags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$VERSION" \
    -o "$OUT/crictl" sigs.k8s.io/cri-tools/cmd/crictl
  "$OUT/crictl" --version
}

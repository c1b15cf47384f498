# The CNI plugins a lab node's containerd calls: bridge + host-local IPAM for pod networking,
# loopback for each pod's lo, portmap for hostPort.
VERSION=v1.10.0
BINS=(bridge host-local loopback portmap)
COLD_SECONDS=10

build() {
  local p=github.com/containernetworking/plugins/plugins
  go build -p "$GO_PROCS" -o "$OUT/" \
    -ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$VERSION" \
    $p/main/bridge $p/ipam/host-local $p/main/loopback $p/meta/portmap
  "$OUT/bridge" --version 2>&1 | head -n1 || true
}

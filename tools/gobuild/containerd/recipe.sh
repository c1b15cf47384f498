# containerd 2.x for the lab's real nodes (kubelet 1.36 needs containerd >= 2.0; Debian ships 1.7).
# The btrfs/devmapper/zfs snapshotters need C libraries and are never used (overlayfs is).
VERSION=v2.4.2
BINS=(containerd containerd-shim-runc-v2 ctr)
COLD_SECONDS=76

build() {
  local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$VERSION"
  ld+=" -X github.com/containerd/containerd/v2/version.Revision=gobuild"
  go build -p "$GO_PROCS" -tags "no_btrfs no_devmapper no_zfs" -ldflags="$ld" -o "$OUT/" \
    "${BINS[@]/#/github.com/containerd/containerd/v2/cmd/}"
  "$OUT/containerd" --version
}

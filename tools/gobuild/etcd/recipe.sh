# etcd: Debian's etcd-server (3.4) is below Kubernetes' documented minimum, so build 3.6.
VERSION=v3.6.14
BINS=(etcd)
COLD_SECONDS=134

build() {
  go build -p "$GO_PROCS" -ldflags="-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
  "$OUT/etcd" --version
}

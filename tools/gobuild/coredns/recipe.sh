# Cluster DNS for the lab's real nodes (*.svc.cluster.local). main.go links only the plugins the
# lab's Corefile uses; the stock build links every cloud provider's SDK.
VERSION=v1.15.0
BINS=(coredns)
COLD_SECONDS=90

build() {
  go build -p "$GO_PROCS" -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$VERSION" \
    -o "$OUT/coredns" .
  "$OUT/coredns" -version
}

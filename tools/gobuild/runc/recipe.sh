# runc for containerd's shim. Debian's 1.1.5 fails under containerd 2.4 here ("can't get final
# child's PID from pipe: EOF"). It must be built with cgo and libseccomp: without seccomp support
# every pod fails with "seccomp: config provided but seccomp not supported".
VERSION=v1.5.3
BINS=(runc)
APT=(libseccomp-dev pkg-config gcc)
COLD_SECONDS=15

build() {
  export CGO_ENABLED=1
  go build -p "$GO_PROCS" -tags seccomp -ldflags="-s -w -X main.version=${VERSION#v}" \
    -o "$OUT/runc" github.com/opencontainers/runc
  "$OUT/runc" --version
}

# The Pulumi CLI and a Python language host of our own (upstream's host is an untagged nested
# module the proxy does not serve): see cmd/pulumi-language-python.
VERSION=v3.274.1
BINS=(pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python)
PREPARES=(pulumi-language-python-exec pulumi-resource-pulumi-python)
COLD_SECONDS=326

# The executor scripts ship in the sdk/v3 module (module zips drop file modes).
prepare() {
  local sdk
  sdk=$(moddir github.com/pulumi/pulumi/sdk/v3)
  install -m 755 "$sdk/python/cmd/pulumi-language-python-exec" "$OUT/"
  install -m 755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$OUT/"
}

build() {
  local ld="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$VERSION"
  go build -p "$GO_PROCS" -tags=osusergo,grpcnotrace -ldflags="$ld" -o "$OUT/pulumi" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  go build -p "$GO_PROCS" -tags=osusergo,grpcnotrace \
    -ldflags="-s -w -X main.version=${VERSION#v}" -o "$OUT/pulumi-language-python" \
    ./cmd/pulumi-language-python
  "$OUT/pulumi" version
}

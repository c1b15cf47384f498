# pulumi-resource-kubernetes. provider/v4 is untagged; the only version the module proxy serves
# here is this pseudo-version (2026-01-15, between the 4.24.0 and 4.29.0 tags); the PyPI
# pulumi-kubernetes 4.32.0 SDK talks to it fine.
VERSION=v4.0.0-20260115033456-f47bc2d6f199
BINS=(pulumi-resource-kubernetes)
PREPARES=(.src/schema-embed.json .src/terraform-mapping-embed.json)
COLD_SECONDS=559
PROVIDER_VERSION=4.24.0-dev.20260115+f47bc2d6f199 # what the plugin reports

# main.go embeds schema-embed.json and terraform-mapping-embed.json, which upstream generates
# (gitignored, so absent from the module zip): write both from the module's committed JSON into
# $WORK, a scratch copy of this folder that build() compiles.
prepare() {
  local mod
  mod=$(moddir github.com/pulumi/pulumi-kubernetes/provider/v4)
  python3 - "$mod/cmd/pulumi-resource-kubernetes" "$PROVIDER_VERSION" "$WORK" <<'PY'
import json, sys
src, version, out = sys.argv[1:4]
with open(f"{src}/schema.json") as f:
    schema = json.load(f)
schema["version"] = version
with open(f"{out}/schema-embed.json", "w") as f:
    json.dump(schema, f, separators=(",", ":"))
with open(f"{src}/terraform-mapping.json") as f:
    mapping = json.load(f)
with open(f"{out}/terraform-mapping-embed.json", "w") as f:
    json.dump(mapping, f, separators=(",", ":"))
PY
}

build() {
  cd "$WORK"
  go build -p "$GO_PROCS" \
    -ldflags="-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$PROVIDER_VERSION" \
    -o "$OUT/pulumi-resource-kubernetes" .
}

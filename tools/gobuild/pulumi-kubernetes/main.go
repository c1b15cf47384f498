// Command pulumi-resource-kubernetes is a build wrapper around the Kubernetes provider's library.
//
// The upstream entry point embeds schema-embed.json and terraform-mapping-embed.json, which are
// generated (gitignored upstream, so absent from the module zip). scripts/build-tools.sh writes
// both from the module's committed schema.json / terraform-mapping.json into a scratch copy of
// this folder before `go build`; nothing generated is committed here.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}

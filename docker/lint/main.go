// dockerfile-lint: BuildKit's Dockerfile checks (the rules `docker build --check` runs),
// without a Docker daemon or a registry. Base images are not fetched: their configuration
// is taken as empty, so the checks that need one (e.g. InvalidBaseImagePlatform) are moot.
//
//	dockerfile-lint FILE...   prints FILE:LINE: Rule: message per finding; exit 1 if any
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	digest "github.com/opencontainers/go-digest"
)

type offline struct{}

const emptyImage = `{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{}}`

func (offline) ResolveImageConfig(_ context.Context, ref string, _ sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	return ref, digest.FromString(ref), []byte(emptyImage), nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dockerfile-lint FILE...")
		os.Exit(2)
	}
	findings := 0
	for _, path := range os.Args[1:] {
		dt, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		sm := llb.NewSourceMap(nil, path, "Dockerfile", dt)
		sm.Definition = &llb.Definition{} // the results carry the source; no LLB is built
		res, err := dockerfile2llb.DockerfileLint(context.Background(), dt, dockerfile2llb.ConvertOpt{
			SourceMap:    sm,
			MetaResolver: offline{},
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(2)
		}
		for _, w := range res.Warnings {
			line := 0
			if w.Location != nil && len(w.Location.Ranges) > 0 {
				line = int(w.Location.Ranges[0].Start.Line)
			}
			fmt.Printf("%s:%d: %s: %s\n", path, line, w.RuleName, w.Detail)
			findings++
		}
		if res.Error != nil {
			line := 0
			if len(res.Error.Location.Ranges) > 0 {
				line = int(res.Error.Location.Ranges[0].Start.Line)
			}
			fmt.Printf("%s:%d: error: %s\n", path, line, res.Error.Message)
			findings++
		}
	}
	if findings > 0 {
		os.Exit(1)
	}
}

// CoreDNS for the real test node's cluster DNS (scripts/test-cluster up --cluster-dns):
// CoreDNS's own main with only the plugins a cluster.local zone needs, so the build leaves
// out the cloud providers' SDKs of the full plugin set. The server types and the Corefile
// syntax are CoreDNS's; a plugin not imported here is unknown to the Corefile.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// dnsserver.Directives orders the plugins of a server block; referencing the package keeps
// its registration of the "dns" server type explicit.
var _ = dnsserver.Directives

func main() { coremain.Run() }

// The sandbox ("pause") image of the real test node (scripts/test-cluster up --real-node):
// PID 1 of every pod's sandbox. It holds the pod's namespaces open, reaps the orphans
// that land on it, and exits on SIGINT or SIGTERM. Built static (CGO_ENABLED=0).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // one SIGCHLD may stand for several exited children
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

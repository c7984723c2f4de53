//go:build linux

package guest

import (
	"os"
	"os/signal"
)

// signalDiscard catches sigs and drops them, for the life of the process.
func signalDiscard(sigs ...os.Signal) {
	c := make(chan os.Signal, 16)
	signal.Notify(c, sigs...)
	go func() {
		for range c {
		}
	}()
}

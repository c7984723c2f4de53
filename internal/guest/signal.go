//go:build linux

package guest

import (
	"os"
	"os/signal"
)

func signalIgnore(sigs ...os.Signal) { signal.Ignore(sigs...) }

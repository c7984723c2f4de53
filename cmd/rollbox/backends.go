package main

import (
	"context"
	"io"
	"os"

	"github.com/rollbox/rollbox/sandbox"
)

// defaultBackend is the embedded default: it needs nothing but this binary.
const defaultBackend = "wasm"

// openBackend wires up a sandbox backend by name. progress gets one line for
// each first-use build.
func openBackend(ctx context.Context, name string, progress io.Writer) (sandbox.Backend, error) {
	switch name {
	case "wasm":
		return openWASM(ctx, progress)
	case "docker":
		return openDocker(ctx, progress)
	default:
		return nil, usagef("backend %q is not one of wasm, docker", name)
	}
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

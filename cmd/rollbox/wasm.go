package main

import (
	"context"
	"io"

	"github.com/rollbox/rollbox/sandbox/wasm"
)

// openWASM opens the embedded backend: guests are built (with a progress
// line) and compiled the first time a command needs them, then cached under
// the rollbox cache directory. A CPython WASI build named by
// $ROLLBOX_PYTHON_WASM / $ROLLBOX_PYTHON_HOME replaces the default python.
func openWASM(ctx context.Context, progress io.Writer, cfg config) (*wasm.Backend, error) {
	return wasm.New(ctx, wasm.Options{Progress: progress, CacheDir: cfg.cacheDir, Builder: cfg.builder(progress),
		PythonWASM: cfg.pythonWASM, PythonHome: cfg.pythonHome})
}

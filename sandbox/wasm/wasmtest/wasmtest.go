// Package wasmtest gives tests of other packages one real WASM backend per
// test binary, shared by every test that needs a sandbox.
package wasmtest

import (
	"context"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

var shared = sync.OnceValues(func() (*wasm.Backend, error) {
	return wasm.New(context.Background(), wasm.Options{})
})

// Backend returns the test binary's shared WASM backend, failing t if it
// cannot be opened. It is never closed: it lives as long as the binary.
func Backend(t testing.TB) *wasm.Backend {
	t.Helper()
	b, err := shared()
	if err != nil {
		t.Fatalf("wasm backend: %v", err)
	}
	return b
}

// Factory returns a function creating sandboxes on the shared backend,
// whatever backend name it is asked for (the shape of agent.SandboxFactory).
func Factory(t testing.TB) func(context.Context, string, sandbox.Spec) (sandbox.Sandbox, error) {
	b := Backend(t)
	return func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		return b.Create(ctx, spec)
	}
}

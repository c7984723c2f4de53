package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestABackendThatFailedToOpenIsOpenedAgainOnTheNextUse(t *testing.T) {
	cfg := readConfig(os.Getenv)
	real := cfg.cacheDir
	blocked := filepath.Join(t.TempDir(), "cache")
	os.WriteFile(blocked, []byte("a file where the cache directory should be"), 0o644)
	cfg.cacheDir = blocked
	b := newBackendSet(io.Discard, cfg)
	defer b.Close()
	if _, err := b.get(context.Background(), "wasm"); err == nil {
		t.Fatal("the wasm backend opened over a cache directory that is a file")
	}
	b.opts.cfg.cacheDir = real // the operator fixed it
	if _, err := b.get(context.Background(), "wasm"); err != nil {
		t.Fatalf("the second open: %v", err)
	}
}

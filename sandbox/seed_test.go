package sandbox_test

import (
	"context"
	"slices"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

func TestSeedWritesEveryFileAndLeavesTheCallersSliceAsItWas(t *testing.T) {
	ctx := context.Background()
	sb, err := wasmtest.Backend(t).Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	files := []sandbox.File{{Path: "/work/z", Data: []byte("z")}, {Path: "/work/a/b", Data: []byte("b")}, {Path: "/work/m", Data: []byte("m")}}
	before := slices.Clone(files)
	if err := sandbox.Seed(ctx, sb, files); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(files, before, func(a, b sandbox.File) bool { return a.Path == b.Path }) {
		t.Errorf("Seed reordered its caller's files: %v, was %v", paths(files), paths(before))
	}
	for _, f := range before {
		got, err := sb.ReadFile(ctx, f.Path, 0)
		if err != nil || string(got) != string(f.Data) {
			t.Errorf("%s: %q %v", f.Path, got, err)
		}
	}
}

func paths(fs []sandbox.File) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Path)
	}
	return out
}

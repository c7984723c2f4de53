// Package retrievertest builds small, real search indexes for the tests of
// other packages.
package retrievertest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/retriever"
)

// Index builds an index of docs (one JSON document each: id, title, text)
// at dir/index, opens it, and closes it when t ends.
func Index(t testing.TB, dir string, docs ...string) *retriever.Index {
	t.Helper()
	path := filepath.Join(dir, "index")
	if _, err := retriever.Build(context.Background(), path, strings.NewReader(strings.Join(docs, "\n")), retriever.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	ix, err := retriever.Open(path, retriever.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ix.Close() })
	return ix
}

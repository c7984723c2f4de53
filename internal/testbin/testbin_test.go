package testbin

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestABuildIsRunnableAndNotRelinkedWhileItsSourcesAreUnchanged: the binary
// runs; a second process's build of the same sources leaves the file as it
// is (go build found it up to date), a changed source is built again.
func TestABuildIsRunnableAndNotRelinkedWhileItsSourcesAreUnchanged(t *testing.T) {
	const pkg = "./internal/testbin/testdata/hello"
	bin := Build(t, pkg)
	if out, err := exec.Command(bin).Output(); err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("%s: %q, %v; want hello", bin, out, err)
	}
	before, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	delete(built, pkg) // as another package's test process would
	mu.Unlock()
	if again := Build(t, pkg); again != bin {
		t.Fatalf("built at %s, then at %s", bin, again)
	}
	after, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) { // go build writes a new file and renames it over the old one (it only touches an up-to-date one)
		t.Errorf("the unchanged build was written again")
	}
	// A file that is not the build of the sources is replaced: another
	// executable, a file cut short.
	other, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	for name, stale := range map[string][]byte{"another executable": other, "a file cut short": other[:4096]} {
		if err := os.WriteFile(bin, stale, 0o755); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		delete(built, pkg)
		mu.Unlock()
		Build(t, pkg)
		if out, err := exec.Command(bin).Output(); err != nil || strings.TrimSpace(string(out)) != "hello" {
			t.Errorf("after %s: %q, %v; want hello", name, out, err)
		}
	}
}

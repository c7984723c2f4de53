package images

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestBuildIsContentAddressedAndASecondBuildIsANoop(t *testing.T) {
	src, err := FindSource()
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	tgt := Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"}
	var progress bytes.Buffer
	b := &Builder{SourceDir: src, CacheDir: cache, Progress: &progress}
	p1, err := b.Build(context.Background(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "building images/guest") {
		t.Errorf("no progress line for a real build: %q", progress.String())
	}
	if st, err := os.Stat(p1); err != nil || st.Size() == 0 || st.Mode()&0o111 == 0 {
		t.Fatalf("built program %s: %v %v", p1, st, err)
	}
	// A second builder (another process) over the same cache builds nothing.
	progress.Reset()
	b2 := &Builder{SourceDir: src, CacheDir: cache, Progress: &progress}
	p2, err := b2.Build(context.Background(), tgt)
	if err != nil || p2 != p1 || progress.Len() != 0 {
		t.Fatalf("second build: %s %v progress %q, want %s and no build", p2, err, progress.String(), p1)
	}
	// The name carries the content hash: another target is another file.
	p3, err := b2.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "arm64", Name: "guest"})
	if err != nil || p3 == p1 || filepath.Dir(p3) == filepath.Dir(p1) {
		t.Fatalf("arm64 build: %s %v", p3, err)
	}
}

func TestBuildWithoutSourceSaysHowToFixIt(t *testing.T) {
	b := &Builder{CacheDir: t.TempDir()}
	_, err := b.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	if !errors.Is(err, ErrNoSource) || !strings.Contains(err.Error(), "ROLLBOX_SRC") {
		t.Fatalf("err = %v", err)
	}
}

func TestASourceDirWithoutOurGoModIsRefused(t *testing.T) {
	b := &Builder{SourceDir: t.TempDir(), CacheDir: t.TempDir()}
	_, err := b.Build(context.Background(), Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	if !errors.Is(err, ErrNoSource) || !strings.Contains(err.Error(), "holds no go.mod") {
		t.Fatalf("a directory without our go.mod was accepted: %v", err)
	}
}

// goLog puts a go command on PATH that logs its arguments to a file before
// running the real one, and returns a function that reads the log's lines
// and empties it.
func goLog(t *testing.T) func() []string {
	t.Helper()
	real, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := "#!/bin/sh\necho \"$*\" >> '" + log + "'\nexec '" + real + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "go"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() []string {
		b, _ := os.ReadFile(log)
		os.Remove(log)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				lines = append(lines, strings.Fields(l)[0])
			}
		}
		return lines
	}
}

// tinyModule writes a module with our module path: cmd/hello imports lib.
func tinyModule(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	files := map[string]string{
		"go.mod":            "module " + Module + "\n\ngo 1.22\n",
		"lib/lib.go":        "package lib\n\nfunc Greeting() string { return \"hello\" }\n",
		"other/other.go":    "package other\n\nfunc Name() string { return \"other\" }\n",
		"cmd/hello/main.go": "package main\n\nimport (\n\t\"fmt\"\n\n\t\"" + Module + "/lib\"\n)\n\nfunc main() { fmt.Println(lib.Greeting()) }\n",
	}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// A build of unchanged source in a later process asks go for nothing (go
// list costs 0.3-0.6 s a target, paid by every run before), and every way
// the source can change still gives a new build: an edited file, a file
// added to a package, a file whose edit kept its size and time, and a new
// in-module import whose package is then edited on its own.
func TestUnchangedSourceIsNotListedAgainAndEveryChangeIsSeen(t *testing.T) {
	calls := goLog(t)
	src := tinyModule(t)
	cache := t.TempDir()
	tgt := Target{Package: "cmd/hello", GOOS: "linux", GOARCH: "amd64", Name: "hello"}
	build := func(what string) string {
		t.Helper()
		p, err := (&Builder{SourceDir: src, CacheDir: cache}).Build(context.Background(), tgt)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return p
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p1 := build("first build")
	if got := calls(); !slices.Equal(got, []string{"list", "build"}) {
		t.Fatalf("first build ran go %v, want list then build", got)
	}
	if p := build("unchanged"); p != p1 {
		t.Fatalf("unchanged source built %s, want %s", p, p1)
	}
	if got := calls(); len(got) != 0 {
		t.Fatalf("a build of unchanged source ran go %v, want nothing", got)
	}

	write("lib/lib.go", "package lib\n\nfunc Greeting() string { return \"hello, world\" }\n")
	p2 := build("edited file")
	if p2 == p1 {
		t.Fatal("an edited file gave the old build")
	}
	calls()

	write("lib/extra.go", "package lib\n\nvar Extra = 1\n")
	p3 := build("added file")
	if p3 == p2 {
		t.Fatal("a file added to a package gave the old build")
	}
	calls()

	// Same size, same modification time, other bytes: the contents are
	// hashed on every build, not trusted from the file's metadata.
	lib := filepath.Join(src, "lib", "lib.go")
	st, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	write("lib/lib.go", "package lib\n\nfunc Greeting() string { return \"HELLO, WORLD\" }\n")
	if err := os.Chtimes(lib, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	p4 := build("same size and time")
	if p4 == p3 {
		t.Fatal("an edit that kept the file's size and time gave the old build")
	}
	calls()

	// A new import of another in-module package: that package's files are
	// part of the build from now on, so editing only them must rebuild.
	write("lib/lib.go", "package lib\n\nimport \""+Module+"/other\"\n\nfunc Greeting() string { return \"hello \" + other.Name() }\n")
	p5 := build("new import")
	calls()
	write("other/other.go", "package other\n\nfunc Name() string { return \"someone else\" }\n")
	p6 := build("edit of the newly imported package")
	calls()
	if p6 == p5 || p5 == p4 {
		t.Fatalf("new import %s, then its package edited %s: want three different builds", p5, p6)
	}
	out, err := exec.Command(p6).Output()
	if err != nil || strings.TrimSpace(string(out)) != "hello someone else" {
		t.Fatalf("the last build prints %q (%v), want the last source's output", out, err)
	}
	if p := build("unchanged again"); p != p6 {
		t.Fatalf("unchanged source built %s, want %s", p, p6)
	}
	if got := calls(); len(got) != 0 {
		t.Fatalf("a build of unchanged source ran go %v, want nothing", got)
	}
}

// BenchmarkSourceHash is what every run pays per program before it can use
// a cached build: go list each time (the memo removed before each call, as
// before the memo existed) beside the memo.
func BenchmarkSourceHash(b *testing.B) {
	src, err := FindSource()
	if err != nil {
		b.Fatal(err)
	}
	bl := &Builder{SourceDir: src, CacheDir: b.TempDir()}
	tgt := Target{Package: "images/wasm/python", GOOS: "wasip1", GOARCH: "wasm", Name: "python.wasm"}
	memo := filepath.Join(bl.CacheDir, "deps")
	for _, tc := range []struct {
		name  string
		reset bool
	}{{"golist", true}, {"memo", false}} {
		b.Run(tc.name, func(b *testing.B) {
			want, err := bl.sourceHash(context.Background(), tgt)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if tc.reset {
					os.RemoveAll(memo)
				}
				got, err := bl.sourceHash(context.Background(), tgt)
				if err != nil || got != want {
					b.Fatalf("hash %s %v, want %s", got, err, want)
				}
			}
		})
	}
}

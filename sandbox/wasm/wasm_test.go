package wasm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/sandboxtest"
)

// testBackend is shared by the tests of this binary, so the guests are
// built and compiled once.
var testBackend *Backend

func TestMain(m *testing.M) {
	b, err := New(context.Background(), Options{Progress: os.Stderr})
	if err != nil {
		panic(err)
	}
	testBackend = b
	code := m.Run()
	b.Close()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, testBackend, sandboxtest.Options{
		NoSignals:      "WASI has no signals: a command ends by exiting, a trap or the timeout",
		NoProcesses:    "WASI has no processes: background jobs and pipeline stages are goroutines of the host-side shell, all stopped with the command",
		NoNetworkStack: "WASI preview 1 modules get no sockets and the shell has no network commands",
		BoundsJobs:     true,
		// The shell has head (a Go builtin here, in this process) and no dd.
		FloodCommand: "head -c 1000000000 /dev/zero",
		FloodBytes:   1_000_000_000,
		Remains: func(t *testing.T, info sandbox.Info) []string {
			var left []string
			if slices.Contains(testBackend.Live(), info.ID) {
				left = append(left, "sandbox "+info.ID+" still registered as live")
			}
			// The backend creates no host files per sandbox; make sure.
			matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "*"+info.ID+"*"))
			return append(left, matches...)
		},
	})
}

func newTestSandbox(t *testing.T, mutate ...func(*sandbox.Spec)) *Sandbox {
	t.Helper()
	var spec sandbox.Spec
	for _, m := range mutate {
		m(&spec)
	}
	sb, err := testBackend.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb.(*Sandbox)
}

func execT(t *testing.T, sb sandbox.Sandbox, req sandbox.ExecRequest) sandbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := sb.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec(%v%q): %v", req.Argv, req.Shell, err)
	}
	return res
}

func TestGuestPrograms(t *testing.T) {
	sb := newTestSandbox(t)
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/work/prog.py", []byte("import sys\nprint('args', sys.argv[1:])\nfor i in range(3):\n    print(i * i)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/work/prog.js", []byte("console.log([1,2].map(x => x * 3), process.argv.slice(2))\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		req    sandbox.ExecRequest
		code   int
		stdout string
		stderr string
	}{
		{"python -c prints", sandbox.ExecRequest{Argv: []string{"python", "-c", "print(1+1)"}}, 0, "2\n", ""},
		{"python runs a file with arguments", sandbox.ExecRequest{Shell: "python3 prog.py a b"}, 0, "args ['a', 'b']\n0\n1\n4\n", ""},
		{"python sys.exit sets the status", sandbox.ExecRequest{Argv: []string{"python", "-c", "import sys; sys.exit(3)"}}, 3, "", ""},
		{"python uncaught exception is status 1 with a traceback", sandbox.ExecRequest{Argv: []string{"python", "-c", "1/0"}}, 1, "", "ZeroDivisionError"},
		{"python reads and writes the episode's files", sandbox.ExecRequest{Shell: `python -c "open('/work/out.txt','w').write('hi')"; cat /work/out.txt`}, 0, "hi", ""},
		{"python has the common str, list and dict methods", sandbox.ExecRequest{Argv: []string{"python", "-c",
			`l = [3, 1]; l.insert(0, 9); d = {"k": 1}; d.update({"j": 2}); print("-".join(["a", "b"]), "x{}y{:>3}{:.2f}".format(1, 2, 0.5), "ab".upper(), l.pop(), sorted(d.keys()))`}},
			0, "a-b x1y  20.50 AB 1 ['j', 'k']\n", ""},
		{"python in a pipeline", sandbox.ExecRequest{Shell: `python -c "print('x\ny')" | wc -l`}, 0, "2\n", ""},
		{"js -e logs", sandbox.ExecRequest{Argv: []string{"js", "-e", "console.log(1+1)"}}, 0, "2\n", ""},
		{"js runs a file", sandbox.ExecRequest{Shell: "node prog.js q"}, 0, "[3,6] [\"q\"]\n", ""},
		{"js process.exit", sandbox.ExecRequest{Argv: []string{"js", "-e", "process.exit(4)"}}, 4, "", ""},
		{"js uncaught error", sandbox.ExecRequest{Argv: []string{"js", "-e", "throw new Error('boom')"}}, 1, "", "boom"},
		{"js reads stdin", sandbox.ExecRequest{Argv: []string{"js"}, Stdin: []byte("console.log('from stdin')")}, 0, "from stdin\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := execT(t, sb, tt.req)
			if res.ExitCode != tt.code || string(res.Stdout) != tt.stdout || !strings.Contains(string(res.Stderr), tt.stderr) {
				t.Errorf("exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q",
					res.ExitCode, res.Stdout, res.Stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// buildC compiles a C program to WASI with Debian's clang; it skips without
// clang, except under CI=true.
func buildC(t *testing.T, src string) []byte {
	t.Helper()
	clang, err := exec.LookPath("clang")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("clang is required under CI (apt-get install clang lld wasi-libc libclang-rt-dev-wasm32): %v", err)
		}
		t.Skipf("clang not found: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "x.wasm")
	cmd := exec.Command(clang, "--target=wasm32-wasi", "-O2", "-o", out, filepath.Join(dir, "x.c"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("clang --target=wasm32-wasi: %v\n%s", err, msg)
		}
		t.Skipf("clang cannot target wasm32-wasi here: %v\n%s", err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

const cProgram = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "trap") == 0) { __builtin_trap(); }
	if (argc > 1 && strcmp(argv[1], "spin") == 0) { volatile unsigned long i = 0; for (;;) i++; }
	if (argc > 1 && strcmp(argv[1], "grow") == 0) {
		static char *keep[4096]; unsigned long sum = 0;
		for (int i = 0; i < 4096; i++) { keep[i] = malloc(1 << 20); if (!keep[i]) { fprintf(stderr, "malloc failed at %d MB\n", i); return 12; } memset(keep[i], i, 1 << 20); sum += keep[i][i]; }
		printf("%lu\n", sum);
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "escape") == 0) {
		FILE *f = fopen("/etc/hostname", "r"); printf("host /etc/hostname: %s\n", f ? "open" : "refused");
		f = fopen("../../../../etc/passwd", "r"); printf("dotdot passwd: %s\n", f ? "open" : "refused");
		return 0;
	}
	char buf[256];
	if (argc > 1 && strcmp(argv[1], "seek") == 0) {
		FILE *f = fopen("/work/in.txt", "r");
		if (!f || fseek(f, 2, SEEK_SET) != 0) { perror("fseek"); return 1; }
		long at = ftell(f);
		if (!fgets(buf, sizeof buf, f)) return 1;
		fseek(f, 0, SEEK_END);
		printf("at %ld: %s" "size %ld\n", at, buf, ftell(f));
		return 0;
	}
	FILE *f = fopen("/work/in.txt", "r");
	if (f && fgets(buf, sizeof buf, f)) { printf("read: %s", buf); fclose(f); }
	f = fopen("/work/from-c.txt", "w"); if (f) { fputs("written by C\n", f); fclose(f); }
	printf("hello from C, %d args\n", argc);
	return 7;
}
`

func TestUserWASM(t *testing.T) {
	mod := buildC(t, cProgram)
	sb := newTestSandbox(t, func(s *sandbox.Spec) { s.Limits.MemoryMB = 32 })
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/work/x.wasm", mod, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/work/in.txt", []byte("seeded\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("a C program reads and writes the episode's files and sets its status", func(t *testing.T) {
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"./x.wasm", "a"}})
		if res.ExitCode != 7 || string(res.Stdout) != "read: seeded\nhello from C, 2 args\n" {
			t.Errorf("exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		if got, err := sb.ReadFile(ctx, "/work/from-c.txt", 0); err != nil || string(got) != "written by C\n" {
			t.Errorf("from-c.txt = %q, %v", got, err)
		}
	})
	t.Run("a C program seeks in an episode's file", func(t *testing.T) {
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"/work/x.wasm", "seek"}})
		if res.ExitCode != 0 || string(res.Stdout) != "at 2: eded\nsize 7\n" {
			t.Errorf("exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("a trap is a result with the trap recorded", func(t *testing.T) {
		res := execT(t, sb, sandbox.ExecRequest{Shell: "/work/x.wasm trap; echo after $?"})
		if res.Trap == "" || !strings.Contains(string(res.Stdout), "after 134") {
			t.Errorf("trap %q stdout %q stderr %q", res.Trap, res.Stdout, res.Stderr)
		}
	})
	t.Run("a spinning module is stopped at the timeout", func(t *testing.T) {
		start := time.Now()
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"/work/x.wasm", "spin"}, Timeout: 300 * time.Millisecond})
		if !res.TimedOut || time.Since(start) > 5*time.Second {
			t.Errorf("TimedOut=%v after %v", res.TimedOut, time.Since(start))
		}
	})
	t.Run("growing memory past the cap fails that exec only", func(t *testing.T) {
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"/work/x.wasm", "grow"}})
		if !res.OOMKilled || res.Trap == "" {
			t.Errorf("OOMKilled=%v trap %q exit %d stderr %q", res.OOMKilled, res.Trap, res.ExitCode, res.Stderr)
		}
		if r := execT(t, sb, sandbox.ExecRequest{Shell: "echo alive"}); string(r.Stdout) != "alive\n" {
			t.Errorf("after OOM: %q", r.Stdout)
		}
	})
	t.Run("host paths do not exist for a module", func(t *testing.T) {
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"/work/x.wasm", "escape"}})
		if string(res.Stdout) != "host /etc/hostname: refused\ndotdot passwd: refused\n" {
			t.Errorf("stdout %q", res.Stdout)
		}
	})
	t.Run("a file that is not WebAssembly is a result", func(t *testing.T) {
		sb.WriteFile(ctx, "/work/bad.wasm", []byte("\x00asm garbage"), 0o755)
		res := execT(t, sb, sandbox.ExecRequest{Argv: []string{"/work/bad.wasm"}})
		if res.ExitCode == 0 {
			t.Errorf("exit 0 for a broken module; stderr %q", res.Stderr)
		}
	})
}

func TestPythonPrefersAConfiguredCPython(t *testing.T) {
	// A stand-in for python.wasm: a C module that reports what it was given.
	mod := buildC(t, `#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) { printf("fake cpython %s PYTHONHOME=%s\n", argc > 1 ? argv[1] : "", getenv("PYTHONHOME")); return 0; }`)
	dir := t.TempDir()
	wasmPath := filepath.Join(dir, "python.wasm")
	os.WriteFile(wasmPath, mod, 0o644)
	os.MkdirAll(filepath.Join(dir, "lib", "python3.13"), 0o755)
	b, err := New(context.Background(), Options{PythonWASM: wasmPath, PythonHome: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res := execT(t, sb, sandbox.ExecRequest{Shell: "python -c pass"})
	if string(res.Stdout) != "fake cpython -c PYTHONHOME=/usr/local\n" {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestPathsEscapingTheEpisodeAreRefused(t *testing.T) {
	sb := newTestSandbox(t)
	ctx := context.Background()
	for _, p := range []string{"/work/../../etc/passwd", "work/x", "/work/./x", "/work//x"} {
		if err := sb.WriteFile(ctx, p, []byte("x"), 0o644); !errors.Is(err, sandbox.ErrPathEscape) {
			t.Errorf("WriteFile(%q) = %v, want ErrPathEscape", p, err)
		}
	}
	execT(t, sb, sandbox.ExecRequest{Shell: "echo secret > /tmp/s; ln -s /tmp/s /work/l; ln -s / /work/root"})
	if _, err := sb.ReadFile(ctx, "/work/l", 0); !errors.Is(err, sandbox.ErrPathEscape) {
		t.Errorf("ReadFile through a symlink: %v, want ErrPathEscape", err)
	}
	if err := sb.WriteFile(ctx, "/work/root/etc/x", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrPathEscape) {
		t.Errorf("WriteFile through a symlink: %v, want ErrPathEscape", err)
	}
	// Inside the episode, .. and / stop at the episode's root.
	res := execT(t, sb, sandbox.ExecRequest{Shell: "cat ../../../../tmp/s; ls /; cat /etc/passwd"})
	if string(res.Stdout) != "secret\ndev\nroot\ntmp\nwork\n" || res.ExitCode == 0 {
		t.Errorf("stdout %q exit %d", res.Stdout, res.ExitCode)
	}
}

func TestDiskCap(t *testing.T) {
	sb := newTestSandbox(t, func(s *sandbox.Spec) { s.Limits.DiskMB, s.Limits.TmpMB = 1, 1 })
	res := execT(t, sb, sandbox.ExecRequest{Shell: "head -c 5000000 /dev/zero > /work/big; echo $?; wc -c < /work/big"})
	if !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if err := sb.WriteFile(context.Background(), "/work/w", make([]byte, 3<<20), 0o644); !errors.Is(err, sandbox.ErrNoSpace) {
		t.Errorf("WriteFile over the cap: %v", err)
	}
}

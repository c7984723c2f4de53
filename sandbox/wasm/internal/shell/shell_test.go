package shell

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newFS() *vfs.FS { return vfs.New(64<<20, "/work", "/tmp", "/root") }

func run(t *testing.T, fsys *vfs.FS, script string) (string, string, Outcome) {
	t.Helper()
	return runLimit(t, fsys, script, 64<<20)
}

func runLimit(t *testing.T, fsys *vfs.FS, script string, mem int64) (string, string, Outcome) {
	t.Helper()
	var out, errb syncBuf
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := RunScript(ctx, Config{FS: fsys, Env: map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/root"},
		Dir: "/work", Stdout: &out, Stderr: &errb, Limits: Limits{MemoryBytes: mem, Jobs: 256}}, script)
	return out.String(), errb.String(), o
}

func TestEverydayCommands(t *testing.T) {
	tests := []struct {
		name, script, want string
	}{
		{"echo through a pipe counts bytes", "echo hi | wc -c", "3\n"},
		{"redirections write and read files", "echo a > f; echo b >> f; cat f", "a\nb\n"},
		{"grep filters lines", "printf 'x1\\ny2\\nx3\\n' | grep x", "x1\nx3\n"},
		{"grep -c counts", "printf 'a\\nb\\na\\n' | grep -c a", "2\n"},
		{"grep BRE groups", `echo abcabc | grep -o '\(abc\)\{2\}'`, "abcabc\n"},
		{"sed substitutes", "echo hello world | sed 's/o/0/g'", "hell0 w0rld\n"},
		{"sed with groups", `echo 'a=1' | sed -E 's/(\w+)=(\w+)/\2=\1/'`, "1=a\n"},
		{"sed -n p with an address", "printf '1\\n2\\n3\\n' | sed -n 2p", "2\n"},
		{"sed -i edits in place", "echo foo > f; sed -i 's/foo/bar/' f; cat f", "bar\n"},
		{"sort and uniq -c", "printf 'b\\na\\nb\\n' | sort | uniq -c", "      1 a\n      2 b\n"},
		{"sort -n -r", "printf '10\\n9\\n100\\n' | sort -nr", "100\n10\n9\n"},
		{"head and tail", "seq 10 | head -3; seq 10 | tail -n 2", "1\n2\n3\n9\n10\n"},
		{"head -c from /dev/zero", "head -c 5 /dev/zero | wc -c", "5\n"},
		{"mkdir, touch, ls", "mkdir -p d/e; touch d/e/x d/y; ls d; ls d/e", "e\ny\nx\n"},
		{"cp, mv, rm", "echo z > a; cp a b; mv b c; rm a; cat c; ls", "z\nc\n"},
		{"find by name and type", "mkdir -p p/q; touch p/q/r.py p/s.txt; find p -name '*.py'; find p -type d", "p/q/r.py\np\np/q\n"},
		{"diff -u shows changes", "printf 'a\\nb\\n' > x; printf 'a\\nc\\n' > y; diff -u x y; echo $?", "--- x\n+++ y\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n1\n"},
		{"test and [", "[ -d /work ] && test -f /nope || echo ok", "ok\n"},
		{"tr and cut", "echo a:b:c | tr a-z A-Z | cut -d: -f2,3", "B:C\n"},
		{"xargs runs commands", "printf '1\\n2\\n' | xargs echo n", "n 1 2\n"},
		{"yes is cut by head", "yes | head -n 2", "y\ny\n"},
		{"env and exports", "export A=1; env | grep ^A=", "A=1\n"},
		{"pwd and cd", "pwd; cd /tmp; pwd", "/work\n/tmp\n"},
		{"command substitution", `x=$(echo hi); echo "[$x]"`, "[hi]\n"},
		{"while read loop", "printf 'a b\\nc d\\n' | while read x y; do echo $y$x; done", "ba\ndc\n"},
		{"read -r keeps backslashes", `printf 'a\\b\n' | { read -r l; echo "$l"; }`, "a\\b\n"},
		{"sh -c nests", "sh -c 'echo $0 $1' me you", "me you\n"},
		{"a script file runs", "printf 'echo from script\\n' > s.sh; chmod +x s.sh; ./s.sh", "from script\n"},
		{"command -v finds builtins", "command -v cat; command -v nope || echo none", "/bin/cat\nnone\n"},
		{"functions and loops", "f() { echo $(( $1 * 2 )); }; for i in 1 2; do f $i; done", "2\n4\n"},
		{"seq with a separator", "seq -s, 3", "1,2,3\n"},
		{"stderr to /dev/null", "ls /nope 2>/dev/null; echo $?", "2\n"},
		{"echo to /dev/stderr", "echo err >/dev/stderr", ""},
		{"eval runs code", `eval 'x=5'; echo $x`, "5\n"},
		{"brace expansion", "echo {a,b}{1,2}", "a1 a2 b1 b2\n"},
		{"tee writes files", "echo t | tee out >/dev/null; cat out", "t\n"},
		{"ln -s and readlink", "ln -s /work/target l; readlink l", "/work/target\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, o := run(t, newFS(), tt.script)
			if out != tt.want {
				t.Errorf("stdout = %q, want %q (stderr %q, exit %d)", out, tt.want, errs, o.ExitCode)
			}
		})
	}
}

func TestExitCodesAndMissingPrograms(t *testing.T) {
	_, _, o := run(t, newFS(), "exit 3")
	if o.ExitCode != 3 {
		t.Errorf("exit = %d, want 3", o.ExitCode)
	}
	_, errs, o := run(t, newFS(), "no-such-thing")
	if o.ExitCode != 127 || !strings.Contains(errs, "not found") {
		t.Errorf("missing program: exit %d stderr %q", o.ExitCode, errs)
	}
	_, errs, o = run(t, newFS(), "echo 'unterminated")
	if o.ExitCode != 2 || errs == "" {
		t.Errorf("syntax error: exit %d stderr %q", o.ExitCode, errs)
	}
}

func TestGuardStopsMemoryGrowth(t *testing.T) {
	tests := []struct{ name, script string }{
		{"a loop that calls a command", `x=a; while true; do x="$x$x$x$x"; done`},
		{"bare assignments with no command", `x=a; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x; x=$x$x`},
		{"a pattern replacement that squares", `x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; for i in 1 2 3 4 5 6; do x=${x//a/$x}; done`},
		{"eval built at run time", `x=a; s='x=$x$x;'; s="$s$s$s$s$s$s$s$s"; s="$s$s$s$s"; eval "$s"`},
		{"a command substitution that never ends", `x=$(yes)`},
		{"read of an endless line", `head -c 1000000000 /dev/zero | read x`},
		{"printf with a huge width", `printf '%1000000000s' x | wc -c`},
		{"unbounded recursion", `f() { f; }; f`},
		{"mapfile of an endless stream", `yes | mapfile a`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			// A line is read a byte at a time, like sh's read does, so a
			// small cap keeps the test quick.
			_, errs, o := runLimit(t, newFS(), tt.script, 4<<20)
			if !o.OOM {
				t.Errorf("OOM = false (exit %d, stderr %q)", o.ExitCode, errs)
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Errorf("took %v", el)
			}
			t.Logf("%s: %s", tt.name, o.Reason)
		})
	}
}

func TestGuardStopsJobFloods(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, script := range []string{`bomb() { bomb | bomb & }; bomb; sleep 5`, `b() { b | b; }; b`, `while true; do sleep 10 & done`} {
		start := time.Now()
		_, errs, o := run(t, newFS(), script)
		if o.ExitCode != 137 || !strings.Contains(o.Reason, "concurrent jobs") && !strings.Contains(o.Reason, "nesting too deep") {
			t.Errorf("%q: exit %d reason %q (stderr %q)", script, o.ExitCode, o.Reason, errs)
		}
		t.Logf("%q: exit %d reason %q in %v", script, o.ExitCode, o.Reason, time.Since(start))
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+10 {
		t.Errorf("%d goroutines left behind (%d before)", n-before, before)
	}
}

func TestJobsKeepTheirStatus(t *testing.T) {
	out, errs, o := run(t, newFS(), `set -o pipefail; false | true; echo $?; (exit 3) & wait $!; echo $?; set -e; false | true; echo reached`)
	if out != "1\n3\n" || o.ExitCode != 1 {
		t.Errorf("stdout %q exit %d stderr %q", out, o.ExitCode, errs)
	}
	out, _, _ = run(t, newFS(), `for i in $(seq 300); do echo $i | cat >/dev/null; done; echo done`)
	if out != "done\n" {
		t.Errorf("sequential pipelines: %q", out)
	}
}

func TestProcessSubstitutionRunsInMemory(t *testing.T) {
	out, errs, o := run(t, newFS(), `cat <(echo x); diff <(printf 'a\nb\n') <(printf 'a\nc\n') >/dev/null; echo "diff=$?"; echo hi > >(cat > f); sleep 0.1; cat f`)
	if out != "x\ndiff=1\nhi\n" || o.ExitCode != 0 {
		t.Errorf("stdout %q exit %d stderr %q", out, o.ExitCode, errs)
	}
}

func TestHugeBraceExpansionsAreRefused(t *testing.T) {
	_, errs, o := run(t, newFS(), "echo {1..100000000}")
	if !o.OOM || !strings.Contains(o.Reason, "brace expansion") {
		t.Errorf("exit %d reason %q stderr %q, want a refusal naming the brace expansion", o.ExitCode, o.Reason, errs)
	}
}

package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

// Options describes the backend under test.
type Options struct {
	// Spec is the base spec each test's sandbox starts from.
	Spec sandbox.Spec
	// NoSignals: the backend has no POSIX signals or processes (WASI).
	NoSignals string
	// NoProcesses: commands cannot fork children (WASI); the reason is reported.
	NoProcesses string
	// NoOOM: the backend reports memory exhaustion as a trap, not an OOM kill.
	NoOOM string
	// NoNetworkStack: the backend has no sockets at all (WASI).
	NoNetworkStack string
	// BoundsJobs: the backend has no processes (NoProcesses) but still
	// bounds concurrent jobs, so the fork-bomb test runs anyway (the WASM
	// backend's shell runs pipeline stages and background commands as
	// goroutines it caps).
	BoundsJobs bool
	// FloodCommand prints about 1 GB to stdout; default uses dd on /dev/zero
	// (a million bytes a write).
	FloodCommand string
	// FloodBytes is how much FloodCommand prints (default 1 GB).
	FloodBytes int64
	// OOMCommand allocates far beyond the spec's memory limit.
	OOMCommand string
	// Remains, if set, is called after Close and must return what is left of
	// the sandbox (containers, mounts, temp dirs) on the host.
	Remains func(t *testing.T, info sandbox.Info) []string
	// ImageVariant: the backend's whole suite already ran on its usual
	// image and runtime, and Spec.Image differs from that image only in
	// its directories (its /tmp 0755 or missing, its workdir not its
	// user's): run only the cases that depend on them, the ones that
	// write /tmp or the workdir by commands, by file requests, or through
	// a fork (a fork's directories are the image's again until the guest
	// fixes them). The others (exit codes, signals, timeouts, limits,
	// network, close) do not look at the image's directories and are not
	// run again; the cases not run are logged by name.
	ImageVariant bool
}

// Run runs the suite against newBackend's sandboxes.
func Run(t *testing.T, backend sandbox.Backend, opts Options) {
	if opts.FloodCommand == "" {
		// A million bytes a write: the same gigabyte through the same
		// pipe as `head -c`, whose 4 KiB writes (busybox) made the case
		// half a million system calls on each side of the pipe, the
		// longest of the suite on every runtime (gVisor: 80-100 s at a
		// load of 22; runc 21-38 s).
		opts.FloodCommand = "dd if=/dev/zero bs=1000000 count=1000 2>/dev/null"
		opts.FloodBytes = 1_000_000_000
	}
	if opts.OOMCommand == "" {
		opts.OOMCommand = `x=a; while true; do x="$x$x$x$x"; done`
	}
	s := &suite{backend: backend, opts: opts}
	// Each test makes and closes sandboxes of its own and judges only
	// them (Remains is asked about one sandbox's ID): they run side by
	// side (up to -test.parallel at once), most of their time being
	// spent waiting on the sandbox.
	// dir marks the cases that depend on the image's /tmp and workdir
	// (Options.ImageVariant), other the rest.
	const dir, other = true, false
	var notRun []string
	for _, tc := range []struct {
		name string
		test func(*testing.T)
		dir  bool
	}{
		// The longest first (on gVisor: seconds since the flood writes a
		// million bytes at a time; a minute before), the rest beside it.
		{"a 1 GB flood comes back capped with the dropped count", s.flood, other},
		{"exec reports exit codes", s.exitCodes, other},
		{"argv runs without a shell", s.argv, other},
		{"stdin reaches the command", s.stdin, other},
		{"env and workdir apply", s.envWorkdir, dir},
		{"a missing program is exit 127, not an error", s.missingProgram, other},
		{"signals are reported", s.signals, other},
		{"a timeout kills the command and its children and keeps earlier output", s.timeout, other},
		{"an idle command is stopped like a timeout", s.idle, other},
		{"cancelling the context stops the command", s.cancel, other},
		{"an out-of-memory command is reported as OOM", s.oom, other},
		{"a fork bomb stays inside the pids limit and the sandbox still answers", s.forkBomb, other},
		{"network egress fails", s.network, other},
		{"commands can write the workdir and /tmp", s.writableDirs, dir},
		{"files round-trip byte-exact", s.files, dir},
		{"reading a missing file is ErrNotFound", s.missingFile, other},
		{"paths outside the sandbox are refused", s.pathEscape, other},
		{"100 concurrent execs in one sandbox", s.concurrent, other},
		{"close during a running exec", s.closeWhileBusy, other},
		{"after close nothing remains", s.nothingRemains, dir},
		{"a fork carries the files, each copy changes alone, and nothing remains", s.fork, dir},
		{"a fork carries what hostile commands left and keeps the parent's hardening", s.forkHostile, dir},
		{"an invalid spec is refused before anything starts", s.invalidSpec, other},
		{"commands cannot make their sandbox fail as the infrastructure's", s.noInfraFromInside, other},
	} {
		if opts.ImageVariant && !tc.dir {
			notRun = append(notRun, tc.name)
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t)
		})
	}
	if len(notRun) > 0 {
		t.Logf("an image that differs only in its directories: not run again (they ran on the backend's usual image): %s", strings.Join(notRun, "; "))
	}
}

type suite struct {
	backend sandbox.Backend
	opts    Options
}

func (s *suite) new(t *testing.T, mutate ...func(*sandbox.Spec)) sandbox.Sandbox {
	t.Helper()
	spec := s.opts.Spec
	for _, m := range mutate {
		m(&spec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := s.backend.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) sh(t *testing.T, sb sandbox.Sandbox, line string) sandbox.Result {
	t.Helper()
	res, err := sb.Exec(ctxT(t, 2*time.Minute), sandbox.ExecRequest{Shell: line})
	if err != nil {
		t.Fatalf("Exec(%q): %v", line, err)
	}
	return res
}

func explain(t *testing.T, reason string) bool {
	if reason != "" {
		t.Logf("does not apply to the %s backend: %s", t.Name(), reason)
		return true
	}
	return false
}

func (s *suite) exitCodes(t *testing.T) {
	sb := s.new(t)
	for _, tc := range []struct {
		line string
		code int
		out  string
	}{
		{"echo hello", 0, "hello\n"},
		{"exit 3", 3, ""},
		{"echo partial; exit 42", 42, "partial\n"},
		{"false", 1, ""},
	} {
		res := s.sh(t, sb, tc.line)
		if res.ExitCode != tc.code || string(res.Stdout) != tc.out {
			t.Errorf("%q: exit %d stdout %q, want exit %d stdout %q", tc.line, res.ExitCode, res.Stdout, tc.code, tc.out)
		}
	}
	res := s.sh(t, sb, "echo oops >&2; exit 1")
	if string(res.Stderr) != "oops\n" {
		t.Errorf("stderr = %q, want %q", res.Stderr, "oops\n")
	}
	if res.Duration <= 0 {
		t.Errorf("Duration = %v, want > 0", res.Duration)
	}
}

func (s *suite) argv(t *testing.T) {
	sb := s.new(t)
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Argv: []string{"echo", "a b", "$HOME", "*"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "a b $HOME *\n" {
		t.Errorf("stdout = %q, want arguments passed verbatim", res.Stdout)
	}
}

func (s *suite) stdin(t *testing.T) {
	sb := s.new(t)
	in := []byte("line one\nline two\n\x00\xff binary\n")
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, in) {
		t.Errorf("cat echoed %q, want %q", res.Stdout, in)
	}
}

func (s *suite) envWorkdir(t *testing.T) {
	sb := s.new(t, func(sp *sandbox.Spec) { sp.Env = map[string]string{"FROM_SPEC": "spec"} })
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{
		Shell:   `echo "$FROM_SPEC $FROM_REQ"; pwd`,
		Env:     map[string]string{"FROM_REQ": "req"},
		Workdir: "/tmp",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(res.Stdout), "spec req\n/tmp\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	res = s.sh(t, sb, "pwd")
	wd := s.opts.Spec.WithDefaults().Workdir
	if got := strings.TrimSpace(string(res.Stdout)); got != wd {
		t.Errorf("default workdir = %q, want %q", got, wd)
	}
}

func (s *suite) missingProgram(t *testing.T) {
	sb := s.new(t)
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Argv: []string{"no-such-program-xyz"}})
	if err != nil {
		t.Fatalf("a missing program must be a Result, got error %v", err)
	}
	if res.ExitCode != 127 {
		t.Errorf("exit = %d, want 127", res.ExitCode)
	}
}

func (s *suite) signals(t *testing.T) {
	if explain(t, s.opts.NoSignals) {
		return
	}
	sb := s.new(t)
	res := s.sh(t, sb, "kill -TERM $$")
	if res.Signal != "SIGTERM" {
		t.Errorf("Signal = %q (exit %d), want SIGTERM", res.Signal, res.ExitCode)
	}
	if res.ExitCode != 128+15 {
		t.Errorf("ExitCode = %d, want 143", res.ExitCode)
	}
}

func (s *suite) timeout(t *testing.T) {
	sb := s.new(t)
	line := "echo before; sleep 30; echo after"
	if s.opts.NoProcesses == "" {
		// A child and a double-forked grandchild that try to outlive the command.
		line = "echo before; (sleep 300 &) ; sh -c 'sleep 301 & sleep 302' & sleep 30; echo after"
	}
	start := time.Now()
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Shell: line, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("timeout took %v to return", el)
	}
	if !res.TimedOut {
		t.Errorf("TimedOut = false (exit %d), want true", res.ExitCode)
	}
	if string(res.Stdout) != "before\n" {
		t.Errorf("stdout = %q, want the output printed before the timeout", res.Stdout)
	}
	if s.opts.NoProcesses != "" {
		explain(t, s.opts.NoProcesses)
		return
	}
	// Nothing of the command may be left running.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps := s.sh(t, sb, "ps -o pid,args 2>/dev/null || ps")
		if !strings.Contains(string(ps.Stdout), "sleep 30") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the timeout:\n%s", ps.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *suite) idle(t *testing.T) {
	sb := s.new(t)
	res, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{
		Shell: "echo tick; sleep 30", Timeout: 20 * time.Second, IdleTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || !res.IdleTimedOut {
		t.Errorf("TimedOut=%v IdleTimedOut=%v, want both", res.TimedOut, res.IdleTimedOut)
	}
	if string(res.Stdout) != "tick\n" {
		t.Errorf("stdout = %q, want %q", res.Stdout, "tick\n")
	}
	if res.Duration > 10*time.Second {
		t.Errorf("idle stop took %v", res.Duration)
	}
}

func (s *suite) cancel(t *testing.T) {
	sb := s.new(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "sleep 30"})
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("cancel took %v", el)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	// The sandbox goes on working.
	if res := s.sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("after cancel: stdout %q", res.Stdout)
	}
}

func (s *suite) flood(t *testing.T) {
	sb := s.new(t)
	const limit = 64 << 10
	res, err := sb.Exec(ctxT(t, 5*time.Minute), sandbox.ExecRequest{Shell: s.opts.FloodCommand, OutputCap: limit, Timeout: 4 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.TimedOut {
		t.Fatalf("the flood timed out after %v", res.Duration)
	}
	if len(res.Stdout) != limit {
		t.Errorf("kept %d bytes, want %d", len(res.Stdout), limit)
	}
	if got := int64(len(res.Stdout)) + res.StdoutDropped; got != s.opts.FloodBytes {
		t.Errorf("kept+dropped = %d, want %d", got, s.opts.FloodBytes)
	}
	t.Logf("1 GB flood: %v", res.Duration)
}

func (s *suite) oom(t *testing.T) {
	if explain(t, s.opts.NoOOM) {
		return
	}
	sb := s.new(t, func(sp *sandbox.Spec) { sp.Limits.MemoryMB = 64 })
	res, err := sb.Exec(ctxT(t, 2*time.Minute), sandbox.ExecRequest{Shell: s.opts.OOMCommand, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled {
		t.Errorf("OOMKilled = false (exit %d, signal %q, trap %q, timed out %v)", res.ExitCode, res.Signal, res.Trap, res.TimedOut)
	}
	if res := s.sh(t, sb, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("sandbox did not survive the OOM: %q", res.Stdout)
	}
}

func (s *suite) forkBomb(t *testing.T) {
	if !s.opts.BoundsJobs && explain(t, s.opts.NoProcesses) {
		return
	}
	sb := s.new(t, func(sp *sandbox.Spec) { sp.Limits.PIDs = 64 })
	res, err := sb.Exec(ctxT(t, 2*time.Minute), sandbox.ExecRequest{
		Shell: `bomb() { bomb | bomb & }; bomb; sleep 2`, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("fork bomb broke the sandbox: %v", err)
	}
	t.Logf("fork bomb: exit %d timed out %v", res.ExitCode, res.TimedOut)
	r2, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Shell: "echo alive"})
	if err != nil || string(r2.Stdout) != "alive\n" {
		t.Fatalf("sandbox stopped answering after a fork bomb: %q %v", r2.Stdout, err)
	}
}

// network: no address is reached from a sandbox with the default network.
// It must prove something on every backend, so a real dialer always runs:
// the probe program (images/probe) built for the backend's platform tries
// TCP to public addresses and a DNS lookup (on WASM, as a WASI module: what
// any program an episode brings could try). Where the image has wget or nc,
// those try too.
func (s *suite) network(t *testing.T) {
	if s.opts.NoNetworkStack != "" {
		t.Logf("%s: the dialer must still fail", s.opts.NoNetworkStack)
	}
	sb := s.new(t)
	ctx := ctxT(t, 3*time.Minute)
	host, inSandbox := probeProgram(t, s.backend.Name())
	bin, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, inSandbox, bin, 0o755); err != nil {
		t.Fatalf("copy the probe in: %v", err)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{inSandbox, "net-egress"}, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("run the probe: %v", err)
	}
	out := strings.TrimSpace(string(res.Stdout))
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	var f struct {
		Pass     bool   `json:"pass"`
		Evidence string `json:"evidence"`
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("the probe printed no finding (exit %d): %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	for _, tried := range []string{"1.1.1.1:443", "8.8.8.8:53"} {
		if !strings.Contains(f.Evidence, tried) {
			t.Errorf("the probe did not try %s: %s", tried, f.Evidence)
		}
	}
	if !f.Pass {
		t.Errorf("network egress from the sandbox: %s", f.Evidence)
	}
	// Any of these tools may exist; none may reach anything.
	res = s.sh(t, sb, `for a in 1.1.1.1 8.8.8.8 169.254.169.254; do
  if command -v wget >/dev/null 2>&1 && wget -q -T 2 -O /dev/null http://$a/ 2>/dev/null; then echo "reached $a"; fi
  if command -v nc >/dev/null 2>&1 && echo | nc -w 2 $a 80 >/dev/null 2>&1; then echo "reached $a"; fi
done
echo checked`)
	if strings.Contains(string(res.Stdout), "reached") || !strings.Contains(string(res.Stdout), "checked") {
		t.Errorf("network egress: %q %q", res.Stdout, res.Stderr)
	}
}

// probeProgram builds images/probe for the backend's platform (once per
// content, cached) and says where to put it in a sandbox.
func probeProgram(t *testing.T, backend string) (host, inSandbox string) {
	t.Helper()
	tgt := images.Target{Package: "images/probe", GOOS: "linux", GOARCH: "amd64", Name: "probe"}
	inSandbox = "/tmp/.rollbox-netprobe"
	if backend == sandbox.BackendWASM {
		tgt = images.Target{Package: "images/probe", GOOS: "wasip1", GOARCH: "wasm", Name: "probe.wasm"}
		inSandbox = "/tmp/rollbox-netprobe.wasm"
	}
	host, err := images.NewBuilder(nil).Build(ctxT(t, 5*time.Minute), tgt)
	if err != nil {
		t.Fatalf("building the probe program: %v", err)
	}
	return host, inSandbox
}

// writableDirs: whatever the image, commands (compilers, test runners'
// temporary directories) can create files and directories in the workdir
// and in /tmp.
func (s *suite) writableDirs(t *testing.T) {
	sb := s.new(t)
	wd := s.opts.Spec.WithDefaults().Workdir
	res := s.sh(t, sb, fmt.Sprintf(`echo a > /tmp/w-a && mkdir -p /tmp/w-d/e && echo b > /tmp/w-d/e/f && echo c > %[1]s/w-c && mkdir -p %[1]s/w-d/e && cat /tmp/w-a /tmp/w-d/e/f %[1]s/w-c`, wd))
	if res.ExitCode != 0 || string(res.Stdout) != "a\nb\nc\n" {
		t.Errorf("writing /tmp and %s: exit %d, %q %q", wd, res.ExitCode, res.Stdout, res.Stderr)
	}
}

func (s *suite) files(t *testing.T) {
	sb := s.new(t)
	ctx := ctxT(t, time.Minute)
	bin := make([]byte, 1<<20)
	rand.Read(bin)
	wd := s.opts.Spec.WithDefaults().Workdir
	cases := map[string][]byte{
		wd + "/hello.txt":      []byte("hello\n"),
		wd + "/sub/dir/binary": bin,
		wd + "/empty":          {},
		wd + "/not-utf8.txt":   {0xff, 0xfe, 0x00, 'x', 0xc3},
		"/tmp/elsewhere.txt":   []byte("tmp is writable too"),
	}
	for p, data := range cases {
		if err := sb.WriteFile(ctx, p, data, 0o644); err != nil {
			t.Fatalf("WriteFile(%s): %v", p, err)
		}
	}
	for p, data := range cases {
		got, err := sb.ReadFile(ctx, p, 0)
		if err != nil {
			t.Fatalf("ReadFile(%s): %v", p, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: read %d bytes, differs from the %d written", p, len(got), len(data))
		}
	}
	// Commands see the files, and files written by commands are readable.
	res := s.sh(t, sb, "cat "+wd+"/hello.txt; echo made > "+wd+"/sub/made.txt")
	if string(res.Stdout) != "hello\n" {
		t.Errorf("cat = %q", res.Stdout)
	}
	if got, err := sb.ReadFile(ctx, wd+"/sub/made.txt", 0); err != nil || string(got) != "made\n" {
		t.Errorf("ReadFile(made.txt) = %q, %v", got, err)
	}
	fis, err := sb.ListFiles(ctx, wd+"/sub")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range fis {
		names = append(names, fmt.Sprintf("%s:%v", fi.Name, fi.IsDir))
	}
	if got := strings.Join(names, ","); got != "dir:true,made.txt:false" {
		t.Errorf("ListFiles = %s", got)
	}
	if _, err := sb.ReadFile(ctx, wd+"/sub/dir/binary", 1000); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Errorf("ReadFile over maxBytes: err = %v, want ErrTooLarge", err)
	}
}

func (s *suite) missingFile(t *testing.T) {
	sb := s.new(t)
	wd := s.opts.Spec.WithDefaults().Workdir
	if _, err := sb.ReadFile(ctxT(t, time.Minute), wd+"/nope", 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
	if _, err := sb.ListFiles(ctxT(t, time.Minute), wd+"/nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ListFiles err = %v, want ErrNotFound", err)
	}
}

func (s *suite) pathEscape(t *testing.T) {
	sb := s.new(t)
	ctx := ctxT(t, time.Minute)
	wd := s.opts.Spec.WithDefaults().Workdir
	for _, p := range []string{"relative/path", wd + "/../../etc/passwd-x"} {
		if err := sb.WriteFile(ctx, p, []byte("x"), 0o644); err == nil {
			t.Errorf("WriteFile(%q) succeeded", p)
		}
	}
	// A symlink planted by a command to point outside must not be followed
	// by ReadFile (CVE-2018-15664 class).
	s.sh(t, sb, "ln -s /etc/hostname "+wd+"/link-out 2>/dev/null; ln -s / "+wd+"/root-link 2>/dev/null; true")
	if data, err := sb.ReadFile(ctx, wd+"/link-out", 0); err == nil {
		t.Errorf("ReadFile followed a symlink out of the workdir: %q", data)
	}
	if err := sb.WriteFile(ctx, wd+"/root-link/etc/planted", []byte("x"), 0o644); err == nil {
		t.Errorf("WriteFile wrote through a symlink to /")
	}
}

func (s *suite) concurrent(t *testing.T) {
	sb := s.new(t)
	ctx := ctxT(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: fmt.Sprintf("echo %d; exit %d", i, i%7)})
			switch {
			case err != nil:
				errs <- err
			case string(res.Stdout) != fmt.Sprintf("%d\n", i) || res.ExitCode != i%7:
				errs <- fmt.Errorf("exec %d: stdout %q exit %d", i, res.Stdout, res.ExitCode)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) closeWhileBusy(t *testing.T) {
	spec := s.opts.Spec
	sb, err := s.backend.Create(ctxT(t, 2*time.Minute), spec)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Shell: "sleep 30"})
			done <- err
		}()
	}
	time.Sleep(300 * time.Millisecond)
	var wg sync.WaitGroup
	for range 3 { // concurrent, idempotent Close
		wg.Add(1)
		go func() { defer wg.Done(); sb.Close() }()
	}
	wg.Wait()
	for range 4 {
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("Exec during Close returned no error")
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Exec still running 15s after Close")
		}
	}
	if _, err := sb.Exec(ctxT(t, time.Minute), sandbox.ExecRequest{Shell: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec after Close: %v, want ErrClosed", err)
	}
}

func (s *suite) nothingRemains(t *testing.T) {
	sb, err := s.backend.Create(ctxT(t, 2*time.Minute), s.opts.Spec)
	if err != nil {
		t.Fatal(err)
	}
	s.sh(t, sb, "echo x > /tmp/x")
	info := sb.Info()
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if s.opts.Remains == nil {
		t.Fatal("the backend's test must say how to find what a sandbox leaves behind (Options.Remains)")
	}
	if left := s.opts.Remains(t, info); len(left) > 0 {
		t.Errorf("after Close, left behind: %v", left)
	}
}

func (s *suite) invalidSpec(t *testing.T) {
	for _, tc := range []struct {
		field string
		mut   func(*sandbox.Spec)
	}{
		{"runtime", func(sp *sandbox.Spec) { sp.Runtime = "kata" }},
		{"limits.memory_mb", func(sp *sandbox.Spec) { sp.Limits.MemoryMB = -5 }},
		{"network", func(sp *sandbox.Spec) { sp.Network = "host" }},
		{"workdir", func(sp *sandbox.Spec) { sp.Workdir = "work" }},
	} {
		spec := s.opts.Spec
		tc.mut(&spec)
		_, err := s.backend.Create(ctxT(t, time.Minute), spec)
		var fe *sandbox.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: err = %v, want a FieldError naming %s", tc.field, err, tc.field)
		}
	}
}

// forkable is a new sandbox of the suite's, its Forker and its workdir.
func (s *suite) forkable(t *testing.T) (sandbox.Sandbox, sandbox.Forker, string) {
	sb := s.new(t)
	f, ok := sandbox.Find[sandbox.Forker](sb)
	if !ok {
		t.Fatalf("the %s backend's sandboxes do not implement sandbox.Forker", sb.Info().Backend)
	}
	wd := sb.Info().Workdir
	if wd == "" {
		wd = "/work"
	}
	return sb, f, wd
}

func (s *suite) fork(t *testing.T) {
	sb, f, wd := s.forkable(t)
	ctx := ctxT(t, 2*time.Minute)
	for p, data := range map[string]string{wd + "/src/a.txt": "v1", "/tmp/t": "tmp"} {
		if err := sb.WriteFile(ctx, p, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if r := s.sh(t, sb, "mkdir -p "+wd+"/empty/dir"); r.ExitCode != 0 {
		t.Fatalf("mkdir: %+v", r)
	}
	if _, err := f.Fork(ctx, 0); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("Fork(0) = %v, want ErrInvalidSpec", err)
	}
	kids, err := f.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if len(kids) != 2 {
		t.Fatalf("Fork(2) made %d", len(kids))
	}
	read := func(sb sandbox.Sandbox, p string) string {
		b, err := sb.ReadFile(ctx, p, 0)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	for i, k := range kids {
		if k.Info().ID == sb.Info().ID || k.Info().Limits != sb.Info().Limits || k.Info().Image != sb.Info().Image {
			t.Errorf("child %d is %+v, parent %+v", i, k.Info(), sb.Info())
		}
		if got := read(k, wd+"/src/a.txt") + "|" + read(k, "/tmp/t"); got != "v1|tmp" {
			t.Errorf("child %d reads %q", i, got)
		}
		if list, err := k.ListFiles(ctx, wd+"/empty"); err != nil || len(list) != 1 || !list[0].IsDir {
			t.Errorf("child %d lacks the empty directory: %v %v", i, list, err)
		}
		if list, err := k.ListFiles(ctx, wd+"/src"); err != nil || len(list) != 1 || list[0].Mode.Perm() != 0o640 {
			t.Errorf("child %d's file mode: %v %v", i, list, err)
		}
	}
	if err := kids[0].WriteFile(ctx, wd+"/src/a.txt", []byte("child"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := s.sh(t, sb, "echo parent > "+wd+"/src/a.txt"); r.ExitCode != 0 {
		t.Fatal(r)
	}
	if got := read(sb, wd+"/src/a.txt") + "|" + read(kids[0], wd+"/src/a.txt") + "|" + read(kids[1], wd+"/src/a.txt"); got != "parent\n|child|v1" {
		t.Errorf("parent|child 0|child 1 read %q, want each its own", got)
	}
	var infos []sandbox.Info
	for _, k := range kids {
		infos = append(infos, k.Info())
	}
	if err := sandbox.CloseAll(kids); err != nil {
		t.Fatal(err)
	}
	if got := read(sb, wd+"/src/a.txt"); got != "parent\n" {
		t.Errorf("closing the children changed the parent: %q", got)
	}
	for _, info := range infos {
		if s.opts.Remains != nil {
			if left := s.opts.Remains(t, info); len(left) > 0 {
				t.Errorf("after Close, child %s left %v", info.ID, left)
			}
		}
	}
}

// forkHostile forks a sandbox whose commands left what a copy trips on:
// files and a directory no one may read (their owner's: the commands'
// user), a FIFO, a socket, a hard link, a symlink to a host file, names
// with a newline and a leading dash, a read-only directory. The fork must
// succeed (a fork failing there is the agent's doing, never an
// infrastructure failure) and carry each as it was, the children must run
// as hardened as the parent (user, capabilities, seccomp, read-only root,
// no new privileges), and what a child changes through a hard link or a
// file it makes readable must not reach the parent or its sibling.
func (s *suite) forkHostile(t *testing.T) {
	sb, f, wd := s.forkable(t)
	ctx := ctxT(t, 3*time.Minute)
	procs := s.opts.NoProcesses == ""
	setup := "cd " + wd + " && echo secret > locked && chmod 000 locked && mkdir -p shut/in && echo inside > shut/in/f && chmod 000 shut" +
		" && echo a > orig && mkdir ro && echo r > ro/f && chmod 555 ro && printf 'nl' > \"$(printf 'new\\nline')\" && echo d > ./-dash" +
		" && ln -s /etc/passwd hostlink"
	if procs {
		setup += " && ln orig hard && mkfifo fifo && mkfifo /tmp/fifo && chmod 640 fifo" +
			" && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' 2>/dev/null; true"
	}
	if r := s.sh(t, sb, setup); r.ExitCode != 0 {
		t.Fatalf("setup: %+v", r)
	}
	kids, err := f.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("Fork of a workspace its commands made: %v (infrastructure: %v)", err, sandbox.IsInfra(err))
	}
	defer sandbox.CloseAll(kids)
	state := "cd " + wd + " && stat -c '%n %a' locked shut ro ro/f -dash && ls -1 | wc -l && ls -1 /tmp | wc -l"
	hard := "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; touch /rootfs-write 2>/dev/null && echo root writable; true"
	if procs {
		state += " && stat -c '%n %a %F' fifo /tmp/fifo && cat hard"
	}
	want := s.sh(t, sb, state)
	wantHard := s.sh(t, sb, hard)
	for i, k := range kids {
		if got := s.sh(t, k, state); string(got.Stdout) != string(want.Stdout) {
			t.Errorf("child %d's files:\n%s\nthe parent's:\n%s", i, string(got.Stdout)+string(got.Stderr), string(want.Stdout)+string(want.Stderr))
		}
		if procs {
			if got := s.sh(t, k, hard); string(got.Stdout) != string(wantHard.Stdout) {
				t.Errorf("child %d runs as:\n%s\nthe parent as:\n%s", i, got.Stdout, wantHard.Stdout)
			}
		}
		if got := s.sh(t, k, "cd "+wd+" && chmod 700 shut && cat shut/in/f && chmod 600 locked && cat locked"); string(got.Stdout) != "inside\nsecret\n" {
			t.Errorf("child %d reads %+v", i, got)
		}
	}
	// A child's changes stay its own.
	change := "cd " + wd + " && echo child > shut/in/f && echo child > locked && rm -f ./-dash"
	if procs {
		change += " && echo child > hard"
	}
	if r := s.sh(t, kids[0], change); r.ExitCode != 0 {
		t.Fatalf("child 0 changing its files: %+v", r)
	}
	if got := s.sh(t, sb, state); string(got.Stdout) != string(want.Stdout) {
		t.Errorf("the parent's files after child 0 changed its own:\n%s\nwere:\n%s", string(got.Stdout)+string(got.Stderr), string(want.Stdout))
	}
	if got := s.sh(t, kids[1], "cd "+wd+" && cat shut/in/f locked"); string(got.Stdout) != "inside\nsecret\n" {
		t.Errorf("child 1 after child 0 changed its own: %+v", got)
	}
	if got := s.sh(t, sb, "cd "+wd+" && cat orig"); string(got.Stdout) != "a\n" {
		t.Errorf("the parent's hard-linked file after a child wrote its own: %q", got.Stdout)
	}
}

// noInfraFromInside: what a sandbox's own commands and file requests do to
// it is never an infrastructure failure. An unscored episode is dropped by
// the trainer, so a policy learns to prefer a sandbox_error over a 0: every
// way in must end with the sandbox still answering, or with an error that
// is the commands' (sandbox.IsAbuse), never IsInfra. Each attack gets a
// sandbox of its own:
//   - a file request the kernel refuses with an errno of its own (sysfs's
//     EINVAL for a link speed) is the request's error;
//   - a command lowers the guest's (PID 1's) RLIMIT_NOFILE, so the next
//     command's pipes cannot be made;
//   - a command sets PID 1's RLIMIT_CPU below what it has spent, so the
//     kernel SIGKILLs it as an outside kill would;
//   - a command writes a Go panic's first line into PID 1's stderr (the
//     guest log; gVisor lets it) and kills PID 1 (gVisor lets that too);
//   - the commands fill a small sandbox's memory with a file, then a file
//     request makes the guest need memory to serve it.
func (s *suite) noInfraFromInside(t *testing.T) {
	judge := func(t *testing.T, what string, err error) {
		t.Helper()
		if err != nil && (sandbox.IsInfra(err) || !sandbox.IsAbuse(err)) {
			t.Errorf("%s: the sandbox failed as the infrastructure's (an unscored episode), not as its commands' doing: %v", what, err)
		}
	}
	t.Run("a file the kernel refuses to read", func(t *testing.T) {
		t.Parallel()
		sb := s.new(t)
		ctx := ctxT(t, time.Minute)
		for _, p := range []string{"/sys/class/net/lo/speed", "/sys/class/net/lo/duplex"} {
			_, err := sb.ReadFile(ctx, p, 0)
			t.Logf("ReadFile(%s): %v", p, err)
			if sandbox.IsInfra(err) || sandbox.IsAbuse(err) {
				t.Errorf("ReadFile(%s): a file's own error is the request's, not a broken sandbox: %v", p, err)
			}
		}
		if _, err := sb.ListFiles(ctx, "/sys/class/net/lo"); sandbox.IsInfra(err) || sandbox.IsAbuse(err) {
			t.Errorf("ListFiles: %v", err)
		}
		s.sh(t, sb, "true")
	})
	if s.opts.NoProcesses != "" {
		t.Logf("no PID 1 for a command to reach: %s", s.opts.NoProcesses)
		return
	}
	t.Run("a file read that needs more memory than the commands left", func(t *testing.T) {
		// The commands fill most of a small sandbox's memory with a file
		// (tmpfs is charged to it); reading it back needs the guest to
		// hold it: under runc the OOM killer ended the guest while no
		// command ran, which read as infrastructure.
		t.Parallel()
		sb := s.new(t, func(sp *sandbox.Spec) { sp.Limits.MemoryMB, sp.Limits.DiskMB = 48, 40 })
		ctx := ctxT(t, time.Minute)
		wd := s.opts.Spec.WithDefaults().Workdir
		// Near the limit the kernel may pick the guest already while the
		// file is written: that too must be the commands' doing.
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "head -c 36m /dev/urandom > " + wd + "/big"}); err != nil {
			judge(t, "writing the file", err)
			return
		}
		for i := 0; i < 2; i++ {
			data, err := sb.ReadFile(ctx, wd+"/big", 0)
			t.Logf("ReadFile: %d bytes, %v", len(data), err)
			judge(t, "reading the file", err)
		}
	})
	host, inSandbox := probeProgram(t, s.backend.Name())
	bin, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"limits", "cpu", "panic"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			sb := s.new(t)
			ctx := ctxT(t, 2*time.Minute)
			if err := sb.WriteFile(ctx, inSandbox, bin, 0o755); err != nil {
				t.Fatalf("copy the probe in: %v", err)
			}
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{inSandbox, "break-guest", "-how", how}, Timeout: time.Minute})
			t.Logf("break-guest -how %s: %q %v", how, strings.TrimSpace(string(res.Stdout)), err)
			if err != nil {
				judge(t, "during the command", err)
				return
			}
			_, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: "echo alive"})
			judge(t, "at the next command", err)
			if err == nil {
				_, err = sb.ListFiles(ctx, s.opts.Spec.WithDefaults().Workdir)
				judge(t, "at the next file request", err)
			}
		})
	}
}

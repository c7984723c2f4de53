//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/guestproto"
)

// harness runs Serve in-process over pipes, as the container's stdio would.
type harness struct {
	c    *guestproto.Client
	root string
	stop func()
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newGuardedHarness(t, 0, nil)
}

// newGuardedHarness is newHarness with the memory guard on at limit bytes,
// sampling usage (the sandbox's sysinfo(2) would be the host's here).
func newGuardedHarness(t *testing.T, limit int64, usage func() int64, opts ...func(*Server)) *harness {
	t.Helper()
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	done := make(chan error, 1)
	s := newServer(guestW, io.Discard)
	if usage != nil {
		s.usage = usage
	}
	for _, o := range opts {
		o(s)
	}
	go func() {
		done <- s.serve(guestR)
		guestW.Close()
	}()
	root := t.TempDir()
	h := &harness{c: guestproto.NewClient(hostR, hostW), root: root}
	h.stop = func() {
		hostW.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(h.stop)
	if _, err := h.c.Call(context.Background(), guestproto.TypeHello, &guestproto.Hello{Version: 1, WritableRoots: []string{root}, MemoryGuardBytes: limit}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) exec(t *testing.T, req *guestproto.Exec) *guestproto.ExecResult {
	t.Helper()
	if req.Env == nil {
		req.Env = []string{"PATH=/usr/bin:/bin"}
	}
	m, err := h.c.Call(context.Background(), guestproto.TypeExec, req)
	if err != nil {
		t.Fatalf("exec %v %q: %v", req.Argv, req.Shell, err)
	}
	var r guestproto.ExecResult
	if err := guestproto.Expect(m, guestproto.TypeExecResult, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestExecReportsWhatTheCommandDid(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name   string
		req    guestproto.Exec
		code   int
		signal string
		stdout string
	}{
		{"a shell line prints and exits", guestproto.Exec{Shell: "echo hi; exit 3"}, 3, "", "hi\n"},
		{"argv runs without a shell", guestproto.Exec{Argv: []string{"echo", "$HOME", "*"}}, 0, "", "$HOME *\n"},
		{"stdin reaches the command", guestproto.Exec{Argv: []string{"cat"}, Stdin: []byte("in\x00put")}, 0, "", "in\x00put"},
		{"a missing program is 127", guestproto.Exec{Argv: []string{"no-such-program-xyz"}}, 127, "", ""},
		{"a signal is named and 128+n", guestproto.Exec{Shell: "kill -TERM $$"}, 143, "SIGTERM", ""},
		{"env and workdir apply", guestproto.Exec{Shell: "echo $X; pwd", Env: []string{"PATH=/usr/bin:/bin", "X=y"}, Workdir: "/tmp"}, 0, "", "y\n/tmp\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.exec(t, &tt.req)
			if r.ExitCode != tt.code || r.Signal != tt.signal || string(r.Stdout) != tt.stdout {
				t.Errorf("exit %d signal %q stdout %q stderr %q, want %d %q %q", r.ExitCode, r.Signal, r.Stdout, r.Stderr, tt.code, tt.signal, tt.stdout)
			}
		})
	}
}

func TestTimeoutKillsTheWholeTreeAndKeepsEarlierOutput(t *testing.T) {
	h := newHarness(t)
	marker := fmt.Sprintf("sleep 3%d", time.Now().UnixNano()%1000+100)
	r := h.exec(t, &guestproto.Exec{
		Shell:   fmt.Sprintf("echo before; (%s &); setsid %s & %s; echo after", marker, marker, marker),
		Timeout: 300 * time.Millisecond,
	})
	if !r.TimedOut || string(r.Stdout) != "before\n" {
		t.Fatalf("timed out %v stdout %q", r.TimedOut, r.Stdout)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := 0
		for _, st := range listProcs() {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.pid))
			if strings.Contains(string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})), marker) {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes survived the timeout", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestIdleTimeoutAndCancel(t *testing.T) {
	h := newHarness(t)
	r := h.exec(t, &guestproto.Exec{Shell: "echo tick; sleep 10", Timeout: 10 * time.Second, IdleTimeout: 200 * time.Millisecond})
	if !r.TimedOut || !r.IdleTimedOut || string(r.Stdout) != "tick\n" || r.Duration > 5*time.Second {
		t.Errorf("idle: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := h.c.Call(ctx, guestproto.TypeExec, &guestproto.Exec{Shell: "sleep 10", Env: []string{"PATH=/bin"}})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("cancel: %v after %v", err, time.Since(start))
	}
	if r := h.exec(t, &guestproto.Exec{Shell: "echo alive"}); string(r.Stdout) != "alive\n" {
		t.Errorf("after cancel: %q", r.Stdout)
	}
}

func TestOutputIsCappedInsideTheGuest(t *testing.T) {
	h := newHarness(t)
	r := h.exec(t, &guestproto.Exec{Shell: "head -c 50000000 /dev/zero; echo err >&2", OutputCap: 1000})
	if len(r.Stdout) != 1000 || r.StdoutDropped != 50_000_000-1000 || string(r.Stderr) != "err\n" {
		t.Errorf("kept %d dropped %d stderr %q", len(r.Stdout), r.StdoutDropped, r.Stderr)
	}
}

func TestBackgroundChildrenDoNotHoldTheResult(t *testing.T) {
	h := newHarness(t)
	start := time.Now()
	r := h.exec(t, &guestproto.Exec{Shell: "sleep 20 & echo started"})
	if string(r.Stdout) != "started\n" || time.Since(start) > 5*time.Second {
		t.Errorf("stdout %q after %v", r.Stdout, time.Since(start))
	}
}

func TestConcurrentExecs(t *testing.T) {
	h := newHarness(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.exec(t, &guestproto.Exec{Shell: fmt.Sprintf("echo %d; exit %d", i, i%5)})
			if string(r.Stdout) != fmt.Sprintf("%d\n", i) || r.ExitCode != i%5 {
				t.Errorf("exec %d: %q exit %d", i, r.Stdout, r.ExitCode)
			}
		}()
	}
	wg.Wait()
}

func TestFilesStayBeneathTheirRoot(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("secret"), 0o644)
	os.Symlink(outside, filepath.Join(h.root, "link-out"))
	os.Symlink("/", filepath.Join(h.root, "root-link"))
	os.MkdirAll(filepath.Join(h.root, "d"), 0o755)
	os.WriteFile(filepath.Join(h.root, "d", "in"), []byte("inside"), 0o644)
	os.Symlink("../d/in", filepath.Join(h.root, "d", "rel-link"))
	os.Symlink("../../..", filepath.Join(h.root, "d", "up-link"))

	write := func(p string, data string) error {
		_, err := h.c.Call(ctx, guestproto.TypeWriteFile, &guestproto.WriteFile{Path: p, Mode: 0o600, Data: []byte(data)})
		return err
	}
	read := func(p string, max int64) ([]byte, error) {
		m, err := h.c.Call(ctx, guestproto.TypeReadFile, &guestproto.ReadFile{Path: p, MaxBytes: max})
		if err != nil {
			return nil, err
		}
		var fd guestproto.FileData
		return fd.Data, guestproto.Expect(m, guestproto.TypeFileData, &fd)
	}
	code := func(err error) string {
		var e *guestproto.Error
		if errors.As(err, &e) {
			return e.Code
		}
		return fmt.Sprint(err)
	}
	if err := write(h.root+"/a/b/c.txt", "deep"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(h.root + "/a/b/c.txt"); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("written file: %v %v", st, err)
	}
	if data, err := read(h.root+"/a/b/c.txt", 0); err != nil || string(data) != "deep" {
		t.Errorf("read back %q %v", data, err)
	}
	if data, err := read(h.root+"/d/rel-link", 0); err != nil || string(data) != "inside" {
		t.Errorf("a symlink inside the root is followed: %q %v", data, err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a symlink to a file outside", func() error { _, err := read(h.root+"/link-out", 0); return err }(), guestproto.CodePathEscape},
		{"a symlink to / in the middle", write(h.root+"/root-link/etc/planted", "x"), guestproto.CodePathEscape},
		{"a relative symlink climbing out", func() error { _, err := read(h.root+"/d/up-link/etc/passwd", 0); return err }(), guestproto.CodePathEscape},
		{"a write outside the roots", write("/etc/planted", "x"), guestproto.CodePathEscape},
		{"a relative path", write("rel", "x"), guestproto.CodePathEscape},
		{"a path with ..", write(h.root+"/../x", "x"), guestproto.CodePathEscape},
		{"a missing file", func() error { _, err := read(h.root+"/nope", 0); return err }(), guestproto.CodeNotFound},
		{"a file over the cap", func() error { _, err := read(h.root+"/d/in", 3); return err }(), guestproto.CodeTooLarge},
	} {
		if got := code(tc.err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, err := os.Stat("/etc/planted"); err == nil {
		t.Errorf("a file was planted outside")
	}
	m, err := h.c.Call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: h.root + "/d"})
	if err != nil {
		t.Fatal(err)
	}
	var dl guestproto.DirList
	guestproto.Expect(m, guestproto.TypeDirList, &dl)
	var names []string
	for _, e := range dl.Entries {
		names = append(names, e.Name+">"+e.Link)
	}
	if got := strings.Join(names, ","); got != "in>,rel-link>../d/in,up-link>../../.." {
		t.Errorf("list = %s", got)
	}
}

// Execs, cancels, timeouts and file requests at once, far more than the
// guest's request slots: each ends, none is stranded, and the guest still
// answers.
func TestConcurrentExecsCancelsTimeoutsAndFilesHammer(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := filepath.Join(h.root, fmt.Sprintf("d%d/f", i%7))
			var err error
			switch i % 5 {
			case 0:
				_, err = h.c.Call(ctx, guestproto.TypeExec, &guestproto.Exec{Shell: fmt.Sprintf("echo %d", i), Env: []string{"PATH=/usr/bin:/bin"}})
			case 1: // cancelled while it runs
				cctx, cancel := context.WithTimeout(ctx, time.Duration(i%20)*time.Millisecond)
				_, err = h.c.Call(cctx, guestproto.TypeExec, &guestproto.Exec{Shell: "sleep 5", Env: []string{"PATH=/usr/bin:/bin"}})
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					err = nil
				}
			case 2: // killed by its own timeout, with a child
				_, err = h.c.Call(ctx, guestproto.TypeExec, &guestproto.Exec{Shell: "sleep 5 & sleep 5", Timeout: 30 * time.Millisecond, Env: []string{"PATH=/usr/bin:/bin"}})
			case 3:
				_, err = h.c.Call(ctx, guestproto.TypeWriteFile, &guestproto.WriteFile{Path: p, Data: []byte("x")})
			case 4:
				_, err = h.c.Call(ctx, guestproto.TypeReadFile, &guestproto.ReadFile{Path: p})
				var e *guestproto.Error
				if errors.As(err, &e) && e.Code == guestproto.CodeNotFound {
					err = nil // not written yet
				}
				if err == nil {
					_, err = h.c.Call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: h.root})
				}
			}
			if err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("requests still unanswered after a minute")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if r := h.exec(t, &guestproto.Exec{Shell: "echo alive"}); string(r.Stdout) != "alive\n" {
		t.Errorf("after the hammer: %q", r.Stdout)
	}
}

// The guest serves file requests as itself: its own /proc entries are
// refused, however they are named, while everything else in /proc is
// served as to any process of the same user.
func TestFileRequestsGetNoneOfTheGuestsOwnProcEntries(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	os.Symlink("/proc/self", filepath.Join(h.root, "self-link"))
	tids, _ := os.ReadDir("/proc/self/task")
	var tid string
	for _, e := range tids {
		if e.Name() != fmt.Sprint(os.Getpid()) {
			tid = e.Name()
		}
	}
	read := func(p string) error {
		_, err := h.c.Call(ctx, guestproto.TypeReadFile, &guestproto.ReadFile{Path: p})
		return err
	}
	list := func(p string) error {
		_, err := h.c.Call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: p})
		return err
	}
	for _, p := range []string{"/proc/self/maps", "/proc/self/environ", "/proc/thread-self/status", fmt.Sprintf("/proc/%d/maps", os.Getpid()),
		"/proc/" + tid + "/status", "/proc/self/task/" + tid + "/maps", "/dev/fd/0", "/dev/stdin", "/proc/mounts"} {
		var e *guestproto.Error
		if err := read(p); !errors.As(err, &e) || e.Code != guestproto.CodeDenied {
			t.Errorf("read %s: %v, want %s", p, err, guestproto.CodeDenied)
		}
	}
	for _, p := range []string{"/proc/self/fd", "/dev/fd", fmt.Sprintf("/proc/%d", os.Getpid())} {
		var e *guestproto.Error
		if err := list(p); !errors.As(err, &e) || e.Code != guestproto.CodeDenied {
			t.Errorf("list %s: %v, want %s", p, err, guestproto.CodeDenied)
		}
	}
	var e *guestproto.Error
	if err := read(h.root + "/self-link/maps"); !errors.As(err, &e) || e.Code != guestproto.CodePathEscape {
		t.Errorf("a symlink to /proc/self: %v", err)
	}
	if err := read("/proc/cpuinfo"); err != nil {
		t.Errorf("/proc/cpuinfo: %v", err)
	}
	if err := list("/proc"); err != nil {
		t.Errorf("listing /proc: %v", err)
	}
}

// A listing is bounded as it is read (Server.maxList): a directory of many
// entries, or of few symlinks with long targets, is refused as too large
// (the caller's to handle), not built in the guest's memory and then
// dropped unsent. Before, a reply over guestproto.MaxMessage was logged and
// never answered: the host waited forever (the verifier's read-out of a
// workspace of 42,000 symlinks with 4,000-byte targets), or the guest was
// OOM-killed building it.
func TestAListingPastItsBoundIsRefusedAsTooLarge(t *testing.T) {
	h := newGuardedHarness(t, 0, nil, func(s *Server) { s.maxList = 8 << 10 })
	ctx := context.Background()
	many, long, small := filepath.Join(h.root, "many"), filepath.Join(h.root, "long"), filepath.Join(h.root, "small")
	for _, d := range []string{many, long, small} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 200 {
		if err := os.WriteFile(filepath.Join(many, fmt.Sprintf("%040d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	target := strings.Repeat("a", 4000)
	for i := range 3 {
		if err := os.Symlink(target, filepath.Join(long, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(small, fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{many, long} {
		_, err := h.c.Call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: d})
		var ge *guestproto.Error
		if !errors.As(err, &ge) || ge.Code != guestproto.CodeTooLarge {
			t.Errorf("list %s: %v, want %s", d, err, guestproto.CodeTooLarge)
		}
	}
	m, err := h.c.Call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: small})
	var dl guestproto.DirList
	if err != nil || guestproto.Expect(m, guestproto.TypeDirList, &dl) != nil || len(dl.Entries) != 3 {
		t.Errorf("list %s: %d entries, %v", small, len(dl.Entries), err)
	}
}

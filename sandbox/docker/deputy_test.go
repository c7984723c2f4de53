package docker_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
)

// The file requests are served by the guest, PID 1, which runs as the same
// user as the commands: its own /proc entries (its memory map, environment,
// file descriptors, the protocol stream among them) are reachable by it
// even where a command is refused them. A file request must get nothing a
// command would not: /proc/self, /proc/thread-self, /proc/1 and the
// guest's threads, and every way to them (/dev/fd, /dev/stdin, symlinks
// into /proc, /proc/1/task/...), are refused, while another process's
// entries stay what a command sees.
func TestFileRequestsGetNothingOfTheGuestsOwnIdentity(t *testing.T) {
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			b := need(t)
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			// The guest's threads: /proc/1/task lists them to a command
			// under gVisor only; a thread id is reachable by path anyway.
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: `ln -s /proc/1/maps /work/maps-link; ln -s /proc/self /work/self-link; ln -s /proc /work/proc-link; ls /proc/1/task 2>/dev/null | tail -n 1`})
			if err != nil {
				t.Fatal(err)
			}
			tid := strings.TrimSpace(string(res.Stdout))
			if tid == "" {
				tid = "2" // the guest's first thread in a fresh PID namespace
			}
			refused := []string{
				"/proc/1/maps", "/proc/1/environ", "/proc/1/status", "/proc/1/cmdline", "/proc/1/auxv",
				"/proc/self/maps", "/proc/self/status", "/proc/self/fd/0", "/proc/self/fdinfo/1",
				"/proc/thread-self/status", "/proc/1/task/1/maps", "/proc/" + tid + "/maps", "/proc/" + tid + "/status",
				"/dev/fd/0", "/dev/stdin", "/dev/stdout", "/proc/net/unix", "/proc/mounts",
			}
			for _, p := range refused {
				data, err := sb.ReadFile(ctx, p, 0)
				if err == nil {
					t.Errorf("ReadFile(%s) gave the guest's own entry (%d bytes): %.80q", p, len(data), data)
				} else if !errors.Is(err, fs.ErrPermission) {
					t.Errorf("ReadFile(%s): %v, want permission refused", p, err)
				}
			}
			// Symlinks out of the workdir are refused anyway.
			for _, p := range []string{"/work/maps-link", "/work/self-link/environ", "/work/proc-link/1/maps", "/work/proc-link/self/maps"} {
				if data, err := sb.ReadFile(ctx, p, 0); !errors.Is(err, sandbox.ErrPathEscape) {
					t.Errorf("ReadFile(%s): %.80q %v, want ErrPathEscape", p, data, err)
				}
			}
			for _, d := range []string{"/proc/1/fd", "/proc/self/fd", "/proc/self", "/dev/fd", "/proc/1/task", "/work/self-link"} {
				if fis, err := sb.ListFiles(ctx, d); err == nil {
					t.Errorf("ListFiles(%s) listed the guest's own entries: %d", d, len(fis))
				}
			}
			// What is not the guest's own is served as to a command.
			if data, err := sb.ReadFile(ctx, "/proc/cpuinfo", 0); err != nil || len(data) == 0 {
				t.Errorf("/proc/cpuinfo: %v", err)
			}
			if fis, err := sb.ListFiles(ctx, "/proc"); err != nil || len(fis) == 0 {
				t.Errorf("listing /proc: %v", err)
			}
			// A command's own entries are the command's to read, and so
			// another's, like any process of the same user.
			res, err = sb.Exec(ctx, sandbox.ExecRequest{Shell: `cat /proc/self/status | grep -c '^Pid:'`})
			if err != nil || strings.TrimSpace(string(res.Stdout)) != "1" {
				t.Errorf("a command reading its own /proc/self: %q %q %v", res.Stdout, res.Stderr, err)
			}
		})
	}
}

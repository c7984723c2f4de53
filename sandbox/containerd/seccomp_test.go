package containerd_test

import (
	"context"
	"testing"

	"github.com/rollbox/rollbox/internal/tinyelf"

	"github.com/rollbox/rollbox/sandbox"
)

// elf is a minimal static x86-64 executable running code.
func elf(code []byte) []byte { return tinyelf.Exec(code) }

// The seccomp filter admits the native system call ABI only: a 32-bit
// (int 0x80) or x32 call is refused, where the default profile, written
// for images of any of the three, let them through (a wider kernel
// surface, and a filter three times as long for runc to compile: ~20 ms of
// each create, RATIONALE.md).
func TestCompatSystemCallsAreRefused(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	exit := []byte{
		0x89, 0xc7, // mov edi, eax
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit, native)
		0x0f, 0x05, // syscall
	}
	for _, tc := range []struct {
		name string
		code []byte
	}{
		// getpid through the i386 ABI, then exit with what it returned.
		{"ia32", append([]byte{0xb8, 0x14, 0x00, 0x00, 0x00, 0xcd, 0x80}, exit...)},
		// getpid through the x32 ABI.
		{"x32", append([]byte{0xb8, 0x27, 0x00, 0x00, 0x40, 0x0f, 0x05}, exit...)},
		// getpid, native: allowed (the program itself works).
		{"native", append([]byte{0xb8, 0x27, 0x00, 0x00, 0x00, 0x0f, 0x05}, exit...)},
	} {
		if err := sb.WriteFile(ctx, "/work/"+tc.name, elf(tc.code), 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/work/" + tc.name}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: exit %d signal %q", tc.name, r.ExitCode, r.Signal)
		pid := r.Signal == "" && r.ExitCode > 0 && r.ExitCode < 200 // getpid answered
		if tc.name == "native" && !pid {
			t.Errorf("native getpid: exit %d signal %q, want a pid", r.ExitCode, r.Signal)
		}
		if tc.name != "native" && pid {
			t.Errorf("%s getpid answered (pid %d): the compat ABI is open", tc.name, r.ExitCode)
		}
	}
}

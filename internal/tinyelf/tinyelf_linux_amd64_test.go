package tinyelf

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The executable runs on this kernel: exit(7) exits 7.
func TestAnExecutableRunsItsCode(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "exit7")
	code := []byte{
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
		0xbf, 0x07, 0x00, 0x00, 0x00, // mov edi, 7
		0x0f, 0x05, // syscall
	}
	if err := os.WriteFile(prog, Exec(code), 0o755); err != nil {
		t.Fatal(err)
	}
	err := exec.Command(prog).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("ran with %v, want exit status 7", err)
	}
}

package lease

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestALeaseIsHeldUntilReleased(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := Held(dir, l.Token()); err != nil || !held {
		t.Fatalf("Held = %v, %v; want true while the lease is held", held, err)
	}
	if n, _ := Sweep(dir); n != 0 {
		t.Errorf("Sweep removed %d held leases", n)
	}
	l.Release()
	l.Release()
	if held, err := Held(dir, l.Token()); err != nil || held {
		t.Fatalf("Held after Release = %v, %v", held, err)
	}
}

// A lease left by a process that died is not held, and Sweep removes it.
func TestALeaseOfADeadProcessIsNotHeld(t *testing.T) {
	dir := t.TempDir()
	if os.Getenv("ROLLBOX_LEASE_CHILD") != "" {
		l, err := Acquire(os.Getenv("ROLLBOX_LEASE_CHILD"))
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString(l.Token())
		os.Exit(0) // without Release: the kernel drops the lock
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestALeaseOfADeadProcessIsNotHeld$")
	cmd.Env = append(os.Environ(), "ROLLBOX_LEASE_CHILD="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	token := string(out)
	if _, err := os.Stat(filepath.Join(dir, token+suffix)); err != nil {
		t.Fatalf("the child's lease file: %v", err)
	}
	if held, err := Held(dir, token); err != nil || held {
		t.Fatalf("Held = %v, %v; want false for a dead process", held, err)
	}
	if n, err := Sweep(dir); n != 1 || err != nil {
		t.Fatalf("Sweep = %d, %v; want 1", n, err)
	}
	if n, _ := Sweep(dir); n != 0 {
		t.Errorf("a second Sweep removed %d", n)
	}
}

func TestBadTokensAreRefused(t *testing.T) {
	for _, tok := range []string{"", "../x", "a/b", "x.lease"} {
		if _, err := Held(t.TempDir(), tok); err == nil {
			t.Errorf("Held(%q) accepted", tok)
		}
	}
}

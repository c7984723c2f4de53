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
	if st, err := Check(dir, l.Token()); err != nil || st != Held {
		t.Fatalf("Check = %v, %v; want Held while the lease is held", st, err)
	}
	if n, _ := Sweep(dir); n != 0 {
		t.Errorf("Sweep removed %d held leases", n)
	}
	l.Release()
	l.Release()
	if st, err := Check(dir, l.Token()); err != nil || st != Missing {
		t.Fatalf("Check after Release = %v, %v; want Missing", st, err)
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
	if st, err := Check(dir, token); err != nil || st != Dead {
		t.Fatalf("Check = %v, %v; want Dead for a dead process", st, err)
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
		if _, err := Check(t.TempDir(), tok); err == nil {
			t.Errorf("Check(%q) accepted", tok)
		}
	}
}

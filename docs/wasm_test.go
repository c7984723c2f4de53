package docs_test

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// The README says that serve and bench on the WASM backend never contact the
// Docker engine (cmd/rollbox's TestServeOnWASMNeverContactsTheDockerEngineAndLogsJSONOnly
// holds serve to it). A bench on WASM, with DOCKER_HOST pointing at a
// socket that counts its connections, makes none and succeeds.
func TestBenchOnWASMNeverContactsTheDockerEngine(t *testing.T) {
	bin := rollboxBinary(t)
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var contacts atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			contacts.Add(1)
			c.Close()
		}
	}()
	cmd := exec.Command(bin, "bench", "--backend", "wasm", "--episodes", "4", "--group", "2", "--turns", "2", "--latency", "1ms", "--json")
	cmd.Env = append(cmd.Environ(), "DOCKER_HOST=unix://"+sock)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rollbox bench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "{") {
		t.Errorf("rollbox bench --json printed no JSON:\n%s", out)
	}
	if n := contacts.Load(); n != 0 {
		t.Errorf("rollbox bench on WASM connected to the Docker engine %d time(s)", n)
	}
}

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/runtime"
)

var healthOnRe = regexp.MustCompile(`"health responder on (http://\S+)`)

// rollbox serve --health-addr in a process of its own (so it can be
// stopped): the responder answers with the service's health, says
// "unresponsive" (503) while the service is stopped and recovers when it
// continues, and goes away with the service.
func TestTheHealthResponderAnswersForTheServiceAndSaysWhenItStopsReporting(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cmd, _ := testSelf("serve", "--addr", "127.0.0.1:0", "--data", data,
		"--health-addr", "127.0.0.1:0", "--health-stale", "1s", "--no-audit-log")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	}()
	urls := make(chan [2]string, 1)
	go func() {
		var health string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := healthOnRe.FindStringSubmatch(sc.Text()); m != nil {
				health = m[1]
			}
			if m := listenRe.FindStringSubmatch(sc.Text()); m != nil && health != "" {
				urls <- [2]string{m[1], health}
			}
		}
	}()
	var api, health string
	select {
	case u := <-urls:
		api, health = u[0], u[1]
	case <-time.After(60 * time.Second):
		t.Fatal("rollbox serve --health-addr did not log both addresses in 60 s")
	}
	get := func(url string) (int, runtime.Health) {
		var h runtime.Health
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			return 0, h
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(&h)
		return resp.StatusCode, h
	}
	waitFor := func(what string, ok func(int, runtime.Health) bool) {
		t.Helper()
		var code int
		var h runtime.Health
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if code, h = get(health); ok(code, h) {
				return
			}
		}
		t.Fatalf("%s: the responder answers %d %+v", what, code, h)
	}
	if _, err := os.Stat(filepath.Join(data, "audit.jsonl")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("--no-audit-log: the data directory has an audit log (%v)", err)
	}
	if code, h := get(api + "/healthz"); code != 200 || h.Status != runtime.HealthOK {
		t.Fatalf("the service's own /healthz: %d %+v", code, h)
	}
	waitFor("a running service", func(code int, h runtime.Health) bool {
		return code == 200 && h.Status == runtime.HealthOK && h.DefaultBackend == "wasm"
	})
	cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	waitFor("a stopped service", func(code int, h runtime.Health) bool { return code == 503 && h.Status == "unresponsive" })
	t.Logf("a stopped service reported unresponsive after %s (--health-stale 1s)", time.Since(stopped).Round(time.Millisecond))
	cmd.Process.Signal(syscall.SIGCONT)
	waitFor("a service continued", func(code int, h runtime.Health) bool { return code == 200 && h.Status == runtime.HealthOK })
	cmd.Process.Kill()
	cmd.Wait()
	waitFor("a killed service", func(code int, _ runtime.Health) bool { return code == 0 }) // nothing listens
}

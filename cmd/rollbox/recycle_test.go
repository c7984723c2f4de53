package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/internal/proc"
	"github.com/rollbox/rollbox/runtime"
)

// rollbox serve in a process of its own, recycled: idle after a rollout
// submitted as soon as it listened, with anonymous memory more than 20%
// above what it started with (the default --recycle-above), it executes
// itself again in place. It is the same process on the
// same listening socket; its anonymous memory is back within 20% of what it
// had before the rollout; the rollout is still there and a new one runs;
// a client opening connections all along, to the API and to the
// --health-addr responder (handed over, not restarted), has every one
// answered 200; and it still stops on SIGTERM with exit 0.
func TestAnIdleServiceExecutesItselfAgainAndGivesItsMemoryBack(t *testing.T) {
	p, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(2)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	data := filepath.Join(t.TempDir(), "data")
	cmd, _ := testSelf("serve", "--addr", "127.0.0.1:0", "--data", data, "--no-audit-log", "--recycle-idle", "1s",
		"--health-addr", "127.0.0.1:0")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	var logMu sync.Mutex
	var logs strings.Builder
	listening, healthOn := make(chan string, 4), make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			logMu.Lock()
			logs.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := listenRe.FindStringSubmatch(sc.Text()); m != nil {
				listening <- m[1]
			}
			if m := healthOnRe.FindStringSubmatch(sc.Text()); m != nil {
				healthOn <- strings.TrimSuffix(m[1], "/healthz")
			}
		}
		exited <- cmd.Wait()
	}()
	logged := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.String()
	}
	var api, health string
	select {
	case health = <-healthOn:
		api = <-listening
	case <-time.After(60 * time.Second):
		t.Fatalf("rollbox serve did not listen in 60 s:\n%s", logged())
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	before := proc.StatusBytes(pid, "RssAnon:")

	// A client opening a connection every 10 ms, all along.
	var answered, failed atomic.Int64
	var firstFailure atomic.Pointer[string]
	stopProbes := make(chan struct{})
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for {
			select {
			case <-stopProbes:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, u := range []string{api, health} {
				resp, err := c.Get(u + "/healthz")
				if err == nil && resp.StatusCode == 200 {
					answered.Add(1)
					resp.Body.Close()
					continue
				}
				failed.Add(1)
				msg := u + ": " + fmt.Sprint(err)
				if err == nil {
					msg = u + ": " + resp.Status
					resp.Body.Close()
				}
				firstFailure.CompareAndSwap(nil, &msg)
			}
		}
	}()

	rollout := func() string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"group_size": 16, "policy": map[string]any{"base_url": p.URL(), "model": "fake-model"},
			"tasks": []any{map[string]any{"id": "say-done", "prompt": "Say done.", "tools": []string{"bash", "finish"},
				"reward": map[string]any{"type": "exact", "answer": "done"}}}})
		resp, err := http.Post(api+"/v1/rollouts", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var created struct{ ID string }
		json.NewDecoder(resp.Body).Decode(&created)
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("POST /v1/rollouts: %s", resp.Status)
		}
		resp, err = http.Get(api + "/v1/rollouts/" + created.ID + "/episodes?stream=1")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
			n++
		}
		resp.Body.Close()
		if n != 16 {
			t.Fatalf("streamed %d episodes of 16", n)
		}
		return created.ID
	}
	id := rollout()
	peak := proc.StatusBytes(pid, "RssAnon:")

	select {
	case again := <-listening:
		if again != api {
			t.Errorf("after recycling, listening on %s, not %s", again, api)
		}
		if h := <-healthOn; h != health {
			t.Errorf("after recycling, the health responder is on %s, not %s", h, health)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the idle service did not execute itself again within 60 s:\n%s", logged())
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the process is gone: %v", err)
	}
	if !strings.Contains(logged(), `"recycles":1`) {
		t.Errorf("the new image does not say it is the first recycle:\n%s", logged())
	}
	time.Sleep(1500 * time.Millisecond)
	after := proc.StatusBytes(pid, "RssAnon:")
	t.Logf("anonymous memory: %.1f MiB before the rollout, %.1f after it, %.1f after recycling", mib(before), mib(peak), mib(after))
	if float64(after) > 1.2*float64(before) {
		t.Errorf("after recycling, %.1f MiB of anonymous memory, more than 20%% above the %.1f MiB before the rollout", mib(after), mib(before))
	}

	var st runtime.RolloutStatus
	resp, err := http.Get(api + "/v1/rollouts/" + id)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.State != runtime.RolloutDone || st.EpisodesDone != 16 {
		t.Errorf("the rollout after recycling: %+v", st)
	}
	rollout()
	resp, err = http.Get(api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var m bytes.Buffer
	m.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(m.String(), "\nrollbox_process_recycles 1\n") {
		t.Errorf("metrics lack rollbox_process_recycles 1")
	}
	close(stopProbes)
	<-probed
	if n := failed.Load(); n > 0 || answered.Load() < 100 {
		first := "none"
		if f := firstFailure.Load(); f != nil {
			first = *f
		}
		t.Errorf("of the connections opened all along, %d were answered and %d failed (the first: %s)", answered.Load(), n, first)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v\n%s", err, logged())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the recycled service did not stop within 30 s of SIGTERM")
	}
	exited <- nil // for the deferred kill
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

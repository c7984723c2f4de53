package runtime_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/runtime"
)

// TestHelperService is not a test: run by TestAServiceKilledMidRolloutIsRecovered
// as a child process, it serves a data directory until it is killed.
func TestHelperService(t *testing.T) {
	dir := os.Getenv("ROLLBOX_HELPER_DATA")
	if dir == "" {
		return // only a child process of the crash test serves (the os/exec tests' idiom)
	}
	maxRunning := envInt("ROLLBOX_HELPER_MAX_RUNNING", 1)
	s := startService(t, dir, func(o *runtime.Options) { o.Limits.MaxRunning = maxRunning })
	fmt.Printf("listening %s\n", s.url)
	select {} // until SIGKILL
}

// startChild runs TestHelperService in a child process on data.
func startChild(t *testing.T, data string, maxRunning int) (*service, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperService$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ROLLBOX_HELPER_DATA="+data, fmt.Sprintf("ROLLBOX_HELPER_MAX_RUNNING=%d", maxRunning))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	url := ""
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			url = u
			break
		}
	}
	if url == "" {
		t.Fatal("the helper service did not start")
	}
	return &service{t: t, url: url, data: data}, cmd
}

func TestAServiceKilledMidRolloutIsRecovered(t *testing.T) {
	p, _ := blockingPolicy(t)
	data := t.TempDir()
	child, cmd := startChild(t, data, 1)
	id := child.submit(rolloutBody(p, 3, task("a")))
	// Episode 0 takes its first turn and waits on the policy; 1 and 2 wait.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if j, _ := filepath.Glob(filepath.Join(data, "episodes", "*.partial")); len(j) == 1 {
			if b, _ := os.ReadFile(j[0]); strings.Count(string(b), `"k":"step"`) == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("episode 0 did not take its first turn")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// kill -9: nothing of the service runs after this.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if _, err := http.Get(child.url + "/healthz"); err == nil {
		t.Fatal("the killed service still answers")
	}

	s := startService(t, data)
	if len(s.rec.Interrupted) != 3 {
		t.Errorf("recovered %v", s.rec)
	}
	st := s.status(id)
	if st.State != runtime.RolloutCancelled || !st.Interrupted || st.EpisodesDone != 3 || st.Ends["interrupted"] != 3 {
		t.Errorf("after the crash: %+v", st)
	}
	for _, e := range s.episodes(id, "?stream=1") {
		if e.Termination.Reason != trajectory.EndInterrupted || (e.GroupIndex == 0) != (len(e.Steps) == 2) {
			t.Errorf("episode %s: %s with %d steps", e.EpisodeID, e.Termination.Reason, len(e.Steps))
		}
	}
}

// TestARestartAfterACrashWith5000UnfinishedEpisodesListensAtOnce kills a
// service with 5,000 episodes unfinished (64 running, the rest queued) and
// measures the next start: it listens as soon as the database is open, and
// recovers every episode in bulk meanwhile.
func TestARestartAfterACrashWith5000UnfinishedEpisodesListensAtOnce(t *testing.T) {
	p, _ := blockingPolicy(t)
	data := t.TempDir()
	child, cmd := startChild(t, data, 64)
	id := child.submit(rolloutBody(p, 2500, task("a"), task("b")))
	child.waitRunning(64, time.Minute)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, journals := episodeFiles(t, data); journals == 64 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("64 episodes did not start")
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	_, journals := episodeFiles(t, data)

	start := time.Now()
	srv, err := runtime.Open(runtime.Options{DataDir: data, Backends: wasmBackends(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	listen := time.Since(start)
	rec, err := srv.Recovered(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	recovered := time.Since(start)
	t.Logf("5,000 unfinished episodes (%d journals): first answer after %s (healthz %d), recovered after %s",
		journals, listen, resp.StatusCode, recovered)
	if listen > time.Second {
		t.Errorf("the service answered %s after it started", listen)
	}
	if len(rec.Interrupted) != 5000 {
		t.Errorf("%d episodes recovered as interrupted", len(rec.Interrupted))
	}
	s := &service{t: t, srv: srv, http: hs, url: hs.URL, data: data}
	st := s.status(id)
	if st.State != runtime.RolloutCancelled || !st.Interrupted || st.EpisodesDone != 5000 || st.Ends["interrupted"] != 5000 {
		t.Errorf("after the restart: %+v", st)
	}
	if records, journals := episodeFiles(t, data); records != 5000 || journals != 0 {
		t.Errorf("%d records and %d journals on disk", records, journals)
	}
}

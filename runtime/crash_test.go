package runtime_test

import (
	"bufio"
	"fmt"
	"net/http"
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
	s := startService(t, dir, func(o *runtime.Options) { o.Limits.MaxRunning = 1 })
	fmt.Printf("listening %s\n", s.url)
	select {} // until SIGKILL
}

func TestAServiceKilledMidRolloutIsRecovered(t *testing.T) {
	p, _ := blockingPolicy(t)
	data := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperService$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ROLLBOX_HELPER_DATA="+data)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
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
	child := &service{t: t, url: url, data: data}
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
	if _, err := http.Get(url + "/healthz"); err == nil {
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

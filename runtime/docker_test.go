package runtime_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// The Docker tests run the service over the real engine with the base
// image; they skip without an engine, and fail instead under CI=true.

// dockerTestOwner labels this test process's containers: its own, so that
// counting them sees nobody else's (other test runs share the engine).
var dockerTestOwner = fmt.Sprintf("rollbox-runtime-test-%d", os.Getpid())

var (
	dockerOnce sync.Once
	dockerBE   *docker.Backend
	dockerSkip string
)

func needDocker(t *testing.T) *docker.Backend {
	t.Helper()
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		guest, err := images.NewBuilder(os.Stderr).Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
		if err != nil {
			dockerSkip = "building the guest agent: " + err.Error()
			return
		}
		be, err := docker.New(ctx, docker.Options{GuestPath: guest, Owner: dockerTestOwner})
		if err != nil {
			dockerSkip = err.Error()
			return
		}
		sb, err := be.Create(ctx, sandbox.Spec{Image: "base"})
		if err != nil {
			dockerSkip = "a base container does not start (rollbox images build base): " + err.Error()
			return
		}
		sb.Close()
		docker.Cleanup(ctx, be.Client(), dockerTestOwner)
		dockerBE = be
	})
	if dockerBE == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("docker engine required under CI=true: %s", dockerSkip)
		}
		t.Skipf("no docker engine: %s", dockerSkip)
	}
	return dockerBE
}

func dockerBackends(t *testing.T) runtime.BackendSource {
	be := needDocker(t)
	wasmSrc := wasmBackends(t)
	return runtime.BackendFunc(func(ctx context.Context, name string) (sandbox.Backend, error) {
		if name == "docker" {
			return be, nil
		}
		return wasmSrc.Backend(ctx, name)
	})
}

// containers lists the test owner's containers.
func containers(t *testing.T) []string {
	t.Helper()
	list, err := dockerBE.Client().ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", docker.LabelOwner+"="+dockerTestOwner))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids
}

func waitContainers(t *testing.T, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := len(containers(t))
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d containers of the test owner, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dockerTask(id string) map[string]any {
	tk := task(id)
	tk["sandbox"] = map[string]any{"backend": "docker", "image": "base"}
	return tk
}

func TestADockerRolloutRunsAndCancelsPromptly(t *testing.T) {
	src := dockerBackends(t)
	p := startPolicy(t, fakepolicy.Config{Responder: answering(func(string) string { return "done" })})
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	id := s.submit(rolloutBody(p, 2, dockerTask("a"), dockerTask("b")))
	eps := s.episodes(id, "?stream=1")
	if len(eps) != 4 {
		t.Fatalf("%d episodes", len(eps))
	}
	for _, e := range eps {
		if e.Termination.Reason != trajectory.EndFinished || e.Reward == nil || *e.Reward.Total != 1 || e.Sandbox.Backend != "docker" ||
			e.Sandbox.ImageDigest == "" || e.Steps[1].Output != "hi\n" {
			t.Errorf("episode %s: %+v %+v %+v", e.EpisodeID, e.Termination, e.Reward, e.Sandbox)
		}
	}
	waitContainers(t, 0, 10*time.Second)

	// Cancel: running containers are removed at once.
	hold, _ := blockingPolicy(t)
	id = s.submit(rolloutBody(hold, 3, dockerTask("c")))
	s.waitState(id, 60*time.Second, func(st status) bool { return st.Running == 3 })
	waitContainers(t, 3, 10*time.Second)
	start := time.Now()
	s.do("DELETE", "/v1/rollouts/"+id, nil, nil)
	st := s.waitState(id, 30*time.Second, func(st status) bool { return st.EpisodesDone == 3 })
	waitContainers(t, 0, 10*time.Second)
	t.Logf("cancel to all containers gone: %s", time.Since(start))
	if st.State != runtime.RolloutCancelled || st.Ends["cancelled"] != 3 {
		t.Errorf("after cancel: %+v", st)
	}
}

// warmPoolService is a service running one docker episode at a time with a
// warm pool of 2, and a policy that holds its episodes until released.
func warmPoolService(t *testing.T) (s *service, hold *fakepolicy.Server, release func()) {
	src := dockerBackends(t)
	hold, release = blockingPolicy(t)
	s = startService(t, "", func(o *runtime.Options) {
		o.Backends = src
		o.Limits.Backend = map[string]int{"docker": 1}
		o.Limits.WarmPool = map[string]int{"docker": 2}
	})
	return s, hold, release
}

func TestWarmDockerPoolsAreSizedFromWaitingEpisodes(t *testing.T) {
	s, hold, release := warmPoolService(t)
	id := s.submit(rolloutBody(hold, 4, dockerTask("a"))) // 1 runs, 3 wait: the pool aims for 2
	s.waitState(id, 60*time.Second, func(st status) bool { return st.Running == 1 })
	s.waitPoolReady(2, 30*time.Second)
	release()
	st := s.waitState(id, 90*time.Second, func(st status) bool { return st.State == runtime.RolloutDone })
	if st.Ends["finished"] != 4 {
		t.Errorf("status %+v", st)
	}
	m := s.metrics()
	hits := regexp.MustCompile(`rollbox_sandbox_pool_hits_total\{backend="docker"\} (\d+)`).FindStringSubmatch(m)
	if hits == nil {
		t.Fatal("no pool hits metric")
	}
	if n, _ := strconv.Atoi(hits[1]); n < 1 {
		t.Errorf("no episode got a warm sandbox: %s", hits[0])
		for _, l := range strings.Split(m, "\n") {
			if strings.Contains(l, "sandbox") {
				t.Log(l)
			}
		}
	}
	waitContainers(t, 0, 20*time.Second) // no demand left: the pool shrinks to nothing
}

// waitPoolReady waits until the docker warm pool holds want ready sandboxes.
func (s *service) waitPoolReady(want int, within time.Duration) {
	s.t.Helper()
	ready := regexp.MustCompile(`rollbox_sandbox_pool_ready\{backend="docker"\} (\d+)`)
	deadline := time.Now().Add(within)
	for {
		m := ready.FindStringSubmatch(s.metrics())
		if m != nil && m[1] == strconv.Itoa(want) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the warm pool did not reach %d ready sandboxes in %v: %v", want, within, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAWarmPoolIsFilledForASpecBeforeAnyEpisodeOfItStarts(t *testing.T) {
	s, hold, release := warmPoolService(t)
	first := s.submit(rolloutBody(hold, 1, dockerTask("a"))) // holds the only docker slot
	s.waitState(first, 60*time.Second, func(st status) bool { return st.Running == 1 })
	other := dockerTask("b")
	other["sandbox"].(map[string]any)["limits"] = map[string]any{"memory_mb": 96} // a spec of its own
	second := s.submit(rolloutBody(hold, 3, other))
	// None of b's episodes can start, yet its spec is known from admission:
	// the pool makes 2 sandboxes of it.
	s.waitPoolReady(2, 30*time.Second)
	if st := s.status(second); st.Running != 0 || st.EpisodesDone != 0 {
		t.Fatalf("b's episodes started: %+v", st)
	}
	release()
	for _, id := range []string{first, second} {
		if st := s.waitState(id, 90*time.Second, func(st status) bool { return st.State == runtime.RolloutDone }); st.Ends["finished"] != st.EpisodesTotal {
			t.Errorf("status %+v", st)
		}
	}
	waitContainers(t, 0, 20*time.Second)
}

func TestEnvironmentModeStepsADockerSandbox(t *testing.T) {
	src := dockerBackends(t)
	s := startService(t, "", func(o *runtime.Options) { o.Backends = src })
	var opened struct{ ID string }
	if code, _ := s.do("POST", "/v1/episodes", map[string]any{"task": dockerTask("env")}, &opened); code != 201 {
		t.Fatalf("open: %d", code)
	}
	var r struct {
		Results []struct {
			Output   string
			ExitCode *int `json:"exit_code"`
		}
	}
	for _, cmd := range []string{"true", "cat hello.txt", "exit 3"} {
		if code, _ := s.do("POST", "/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{
			map[string]any{"name": "bash", "arguments": map[string]any{"command": cmd}}}}, &r); code != 200 {
			t.Fatalf("step %q: %d", cmd, code)
		}
	}
	if *r.Results[0].ExitCode != 3 {
		t.Errorf("exit 3: %+v", r.Results)
	}
	var tr trajectory.Trajectory
	s.do("GET", "/v1/episodes/"+opened.ID, nil, &tr)
	if tr.Sandbox.Backend != "docker" || tr.Sandbox.ID == "" || len(tr.Steps) != 6 || tr.Steps[3].Output != "hi\n" {
		t.Errorf("trajectory: %+v, %d steps", tr.Sandbox, len(tr.Steps))
	}
	s.do("DELETE", "/v1/episodes/"+opened.ID, nil, nil)
	waitContainers(t, 0, 10*time.Second)
}

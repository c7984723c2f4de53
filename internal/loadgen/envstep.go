package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"time"
)

// EnvStepResult is what an environment-mode step bench measures.
type EnvStepResult struct {
	Steps        int         `json:"steps"`
	Image        string      `json:"image"`
	StepHTTPMS   Percentiles `json:"step_http_ms"`
	ToolMS       Percentiles `json:"tool_ms"`
	DockerExecMS Percentiles `json:"docker_exec_ms"`
	RatioP50     float64     `json:"ratio_p50"`
	RatioP99     float64     `json:"ratio_p99"`
}

// EnvStep opens one environment-mode episode on docker (image) at the
// service at base and times n steps of bash `true` over HTTP, interleaved
// with `docker exec` of the same command in the same container.
func EnvStep(ctx context.Context, base, image string, n int) (*EnvStepResult, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, errors.New("the docker CLI is needed for the docker exec baseline")
	}
	post := func(path string, body any, out any) error {
		b, _ := json.Marshal(body)
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return fmt.Errorf("POST %s: %s %s", path, resp.Status, raw)
		}
		if out != nil {
			return json.Unmarshal(raw, out)
		}
		return nil
	}
	task := map[string]any{"id": "bench-step", "prompt": "Run true.", "sandbox": map[string]any{"backend": "docker", "image": image},
		"tools": []string{"bash", "finish"}, "reward": map[string]any{"type": "exact", "answer": "done"},
		"limits": map[string]any{"max_turns": n + 20, "episode_timeout_s": 3600}}
	var opened struct{ ID string }
	if err := post("/v1/episodes", map[string]any{"task": task}, &opened); err != nil {
		return nil, err
	}
	defer func() {
		req, _ := http.NewRequest("DELETE", base+"/v1/episodes/"+opened.ID, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	resp, err := http.Get(base + "/v1/episodes/" + opened.ID)
	if err != nil {
		return nil, err
	}
	var tr struct {
		Sandbox struct{ ID string } `json:"sandbox"`
	}
	json.NewDecoder(resp.Body).Decode(&tr)
	resp.Body.Close()
	if tr.Sandbox.ID == "" {
		return nil, errors.New("the episode's sandbox has no container id")
	}
	step := func() (float64, error) {
		t0 := time.Now()
		var r struct {
			Results []struct {
				ExitCode *int `json:"exit_code"`
			}
		}
		err := post("/v1/episodes/"+opened.ID+"/step", map[string]any{"tool_calls": []any{
			map[string]any{"name": "bash", "arguments": `{"command":"true"}`}}}, &r)
		d := float64(time.Since(t0)) / float64(time.Millisecond)
		if err == nil && (len(r.Results) != 1 || r.Results[0].ExitCode == nil || *r.Results[0].ExitCode != 0) {
			js, _ := json.Marshal(r)
			err = fmt.Errorf("bash true did not exit 0: the step answered %s", js)
		}
		return d, err
	}
	dockerExec := func() (float64, error) {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, "docker", "exec", tr.Sandbox.ID, "true").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("docker exec: %v: %s", err, out)
		}
		return float64(time.Since(t0)) / float64(time.Millisecond), nil
	}
	for range 5 { // warm up both paths
		if _, err := step(); err != nil {
			return nil, err
		}
		if _, err := dockerExec(); err != nil {
			return nil, err
		}
	}
	var steps, execs []float64
	for range n {
		d, err := step()
		if err != nil {
			return nil, err
		}
		steps = append(steps, d)
		if d, err = dockerExec(); err != nil {
			return nil, err
		}
		execs = append(execs, d)
	}
	resp, err = http.Get(base + "/v1/episodes/" + opened.ID)
	if err != nil {
		return nil, err
	}
	var full struct {
		Steps []struct {
			Type       string  `json:"type"`
			DurationMS float64 `json:"duration_ms"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&full)
	resp.Body.Close()
	var tool []float64
	for _, s := range full.Steps {
		if s.Type == "tool" {
			tool = append(tool, s.DurationMS)
		}
	}
	if len(tool) > n {
		tool = tool[len(tool)-n:]
	}
	res := &EnvStepResult{Steps: n, Image: image, StepHTTPMS: PercentilesOf(steps), ToolMS: PercentilesOf(tool), DockerExecMS: PercentilesOf(execs)}
	res.RatioP50 = res.StepHTTPMS.P50 / res.DockerExecMS.P50
	res.RatioP99 = res.StepHTTPMS.P99 / res.DockerExecMS.P99
	return res, nil
}

// Report prints the result for a reader.
func (res *EnvStepResult) Report(w io.Writer) {
	fmt.Fprintf(w, "env-step bench: %d steps of bash `true` on docker (%s), interleaved with docker exec in the same container\n", res.Steps, res.Image)
	fmt.Fprintf(w, "  POST step over HTTP   %s\n", res.StepHTTPMS)
	fmt.Fprintf(w, "    of which the tool   %s   (guest exec as recorded)\n", res.ToolMS)
	fmt.Fprintf(w, "  docker exec (CLI)     %s\n", res.DockerExecMS)
	fmt.Fprintf(w, "  ratio step/exec       p50 %.3f  p99 %.3f\n", res.RatioP50, res.RatioP99)
}

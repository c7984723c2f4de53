package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// The helpers of the probes: running the probe program in the sandbox and
// reading its finding.

// finding is what the probe program prints.
type finding struct {
	Name     string         `json:"name"`
	Pass     bool           `json:"pass"`
	Evidence string         `json:"evidence"`
	Data     map[string]any `json:"data"`
}

// run runs the probe program inside the sandbox.
func (r *runner) run(ctx context.Context, timeout time.Duration, args ...string) (finding, sandbox.Result, error) {
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Argv: append([]string{r.probe}, args...), Timeout: timeout})
	if err != nil {
		return finding{}, res, err
	}
	out := strings.TrimSpace(string(res.Stdout))
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	var f finding
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		return finding{}, res, fmt.Errorf("probe %s printed no finding (exit %d%s): stdout %q, stderr %q",
			args[0], res.ExitCode, sig(res), oneLine(string(res.Stdout), 200), oneLine(string(res.Stderr), 300))
	}
	return f, res, nil
}

func sig(res sandbox.Result) string {
	s := ""
	if res.Signal != "" {
		s += ", " + res.Signal
	}
	if res.OOMKilled {
		s += ", OOM-killed"
	}
	if res.TimedOut {
		s += ", timed out"
	}
	if res.Trap != "" {
		s += ", trap: " + res.Trap
	}
	return s
}

// fromFinding turns the probe's own verdict into a report line.
func fromFinding(f finding, err error) Probe {
	if err != nil {
		return Probe{Status: StatusFail, Evidence: err.Error()}
	}
	return Probe{Status: status(f.Pass), Evidence: f.Evidence, Data: f.Data}
}

// simple runs a probe whose verdict the program gives.
func (r *runner) simple(name string, args ...string) func(context.Context) Probe {
	return func(ctx context.Context) Probe {
		f, _, err := r.run(ctx, 30*time.Second, append([]string{name}, args...)...)
		return fromFinding(f, err)
	}
}

// linuxOnly is simple on containers and not applicable on WASM.
func (r *runner) linuxOnly(name, why string) func(context.Context) Probe {
	return func(ctx context.Context) Probe {
		if r.wasm {
			return Probe{Status: StatusNA, Evidence: why}
		}
		args := []string{name}
		if name == "mounts" {
			args = append(args, "-dir", r.spec.Workdir)
		}
		return r.simple(args[0], args[1:]...)(ctx)
	}
}

// alive checks that the sandbox still answers: destructive probes must
// hurt only the command that ran them.
func (r *runner) alive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	f, res, err := r.run(ctx, 30*time.Second, "ping")
	if err != nil {
		return err
	}
	if f.Name != "ping" || !f.Pass {
		return fmt.Errorf("ping answered %q", oneLine(string(res.Stdout), 200))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return oneLine(s, 120)
}

func errKind(err error) string {
	for _, k := range []error{sandbox.ErrPathEscape, sandbox.ErrNotFound, sandbox.ErrInvalidSpec, sandbox.ErrTooLarge} {
		if errors.Is(err, k) {
			return "refused (" + k.Error() + ")"
		}
	}
	return err.Error()
}

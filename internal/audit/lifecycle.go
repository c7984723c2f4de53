package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// The lifecycle probes: a command's processes end with it, file requests
// get no more than a command would, an agent that breaks its own sandbox
// is told apart from the infrastructure, and a closed sandbox is gone.

// leftovers runs a command that leaves a daemon, fork chains changing
// session at every link and paused children behind and exits, then lists
// the sandbox's processes from the next command: there must be none but
// PID 1 and the lister. Three rounds, since escaping a sweep is a race.
func (r *runner) leftovers(ctx context.Context) Probe {
	if r.wasm {
		return r.wasmLeftovers(ctx)
	}
	var ev []string
	pass := true
	for round := 1; round <= 3; round++ {
		f, _, err := r.run(ctx, 30*time.Second, "outlive")
		if err != nil {
			return Probe{Status: StatusFail, Evidence: fmt.Sprintf("round %d: %v", round, err)}
		}
		if round == 1 {
			ev = append(ev, "each round: "+f.Evidence)
		}
		f, _, err = r.run(ctx, 30*time.Second, "procs")
		switch {
		case err != nil:
			pass = false
			ev = append(ev, fmt.Sprintf("round %d: listing: %v", round, err))
		case !f.Pass:
			pass = false
			ev = append(ev, fmt.Sprintf("round %d: %s", round, f.Evidence))
		default:
			ev = append(ev, fmt.Sprintf("round %d: the next command found %s", round, f.Evidence))
		}
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

// fileIdentity reads through the sandbox's file API what only the process
// serving it may read as itself (a container's guest agent is PID 1: its
// memory map, environment, descriptors): every read must be refused, as it
// is to a command.
func (r *runner) fileIdentity(ctx context.Context) Probe {
	var ev []string
	pass := true
	for _, p := range []string{"/proc/self/maps", "/proc/1/maps", "/proc/1/environ", "/proc/self/status", "/proc/thread-self/status",
		"/proc/self/fd/0", "/dev/fd/1", "/dev/stdin", "/proc/1/task/1/status"} {
		data, err := r.sb.ReadFile(ctx, p, 1<<20)
		switch {
		case err == nil:
			pass = false
			ev = append(ev, fmt.Sprintf("ReadFile %s returned %d bytes of the serving process's own", p, len(data)))
		case sandbox.IsInfra(err) || sandbox.IsAbuse(err):
			pass = false
			ev = append(ev, fmt.Sprintf("ReadFile %s broke the sandbox: %v", p, err))
		default:
			ev = append(ev, fmt.Sprintf("ReadFile %s: %s", p, refusal(err)))
		}
	}
	for _, p := range []string{"/proc/self/fd", "/proc/1/fd", "/proc/1/task"} {
		list, err := r.sb.ListFiles(ctx, p)
		if err == nil {
			pass = false
			ev = append(ev, fmt.Sprintf("ListFiles %s listed %d of the serving process's own entries", p, len(list)))
		} else {
			ev = append(ev, fmt.Sprintf("ListFiles %s: %s", p, refusal(err)))
		}
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

func refusal(err error) string {
	if errors.Is(err, fs.ErrPermission) {
		return "refused (permission denied)"
	}
	return errKind(err)
}

// abuse breaks the guest agent of a sandbox of its own (per attack, from
// the audited spec) the ways a command may be able to: SIGKILL and SIGSTOP
// to PID 1, junk written into its stream, its resource limits lowered (no
// descriptors; a CPU time limit, whose SIGKILL looks like a kill from
// outside), a forged panic line in its log before a kill. Each sandbox must either go on
// answering (the runtime protected the guest) or fail with
// sandbox.ErrSandboxAbuse and not as infrastructure: an agent that breaks
// its sandbox is scored 0, it does not get an unscored episode. A frozen
// guest must be found by a bounded check.
func (r *runner) abuse(ctx context.Context) Probe {
	if r.wasm || r.backend == nil {
		return Probe{Status: StatusNA, Evidence: "no guest agent for a command to kill, freeze or garble (a WASM episode's commands run in the host's interpreter and as modules)"}
	}
	hows := []string{"kill", "stop", "garble", "limits", "cpu", "panic"}
	ev := make([]string, len(hows))
	ok := make([]bool, len(hows))
	var wg sync.WaitGroup
	for i, how := range hows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok[i], ev[i] = r.breakGuest(ctx, how)
		}()
	}
	wg.Wait()
	pass := true
	for _, o := range ok {
		pass = pass && o
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

func (r *runner) breakGuest(ctx context.Context, how string) (bool, string) {
	sb, err := r.backend.Create(ctx, r.origSpec)
	if err != nil {
		return false, fmt.Sprintf("%s: creating its sandbox: %v", how, err)
	}
	defer sb.Close()
	if err := sb.WriteFile(ctx, r.probe, r.probeBin, 0o755); err != nil {
		return false, fmt.Sprintf("%s: copying the probe in: %v", how, err)
	}
	start := time.Now()
	judge := func(what string, err error) (bool, string) {
		took := time.Since(start).Round(100 * time.Millisecond)
		switch {
		case sandbox.IsAbuse(err) && !sandbox.IsInfra(err):
			return true, fmt.Sprintf("%s: the sandbox broke %s after %v, reported as the agent's doing (sandbox_abuse): %s", how, what, took, oneLine(err.Error(), 200))
		default:
			return false, fmt.Sprintf("%s: the sandbox broke %s after %v, reported as infrastructure (an unscored episode): %s", how, what, took, oneLine(err.Error(), 200))
		}
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{r.probe, "break-guest", "-how", how}, Timeout: 30 * time.Second})
	if err != nil {
		return judge("during the command", err)
	}
	_, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{r.probe, "ping"}, Timeout: 30 * time.Second})
	if err != nil {
		return judge("at the next command", err)
	}
	var f finding
	if json.Unmarshal([]byte(strings.TrimSpace(string(res.Stdout))), &f) != nil {
		f.Evidence = lastLine(string(res.Stdout))
	}
	return true, fmt.Sprintf("%s; the sandbox still answers", f.Evidence)
}

// removed closes the audited sandbox and asks the host whether it is gone:
// Close must return only once it is, or say why not.
func (r *runner) removed(ctx context.Context) Probe {
	start := time.Now()
	err := r.sb.Close()
	var ev []string
	pass := true
	if err != nil {
		pass = false
		ev = append(ev, "Close: "+err.Error())
	} else {
		ev = append(ev, fmt.Sprintf("Close returned in %v", time.Since(start).Round(time.Millisecond)))
	}
	if r.host == nil {
		ev = append(ev, "no host view to check (the WASM backend's sandbox is memory in this process)")
	} else if _, ierr := r.host.Inspect(ctx, r.rep.Sandbox.ID); errors.Is(ierr, sandbox.ErrNotFound) {
		ev = append(ev, "host: the sandbox does not exist any more")
	} else {
		pass = false
		ev = append(ev, fmt.Sprintf("host: the sandbox is still there after Close (%v)", ierr))
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; ")}
}

// wasmLeftovers starts background jobs that would write after their
// command ended (a plain job, a disowned one, one in a subshell, one in a
// nested sh -c) and checks, after they would have, that none did.
func (r *runner) wasmLeftovers(ctx context.Context) Probe {
	const late = "/tmp/.rollbox-late"
	script := `(sleep 0.5; echo a >> ` + late + `) & (sleep 0.5; echo b >> ` + late + `) & disown; ( (sleep 0.5; echo c >> ` + late + `) & ); sh -c '(sleep 0.5; echo d >> ` + late + `) &'; echo started`
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: script, Timeout: 30 * time.Second})
	if err != nil {
		return Probe{Status: StatusFail, Evidence: "the sandbox broke: " + err.Error()}
	}
	select {
	case <-time.After(1500 * time.Millisecond):
	case <-ctx.Done():
		return Probe{Status: StatusFail, Evidence: ctx.Err().Error()}
	}
	data, err := r.sb.ReadFile(ctx, late, 0)
	ev := fmt.Sprintf("four background jobs (plain, disowned, in a subshell, in sh -c) that write 0.5 s after their command: the command printed %q", strings.TrimSpace(string(res.Stdout)))
	if err == nil {
		return Probe{Status: StatusFail, Evidence: ev + fmt.Sprintf("; 1.5 s later %s holds %q: a job outlived its command", late, data)}
	}
	return Probe{Status: StatusPass, Evidence: ev + "; 1.5 s later nothing had written: the jobs ended with their command"}
}

package audit

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/sandbox"
)

// The isolation probes: who the sandbox runs as and under what, what it can
// reach (network, mounts, the guest agent, host files through copy-out).

func (r *runner) identity(ctx context.Context) Probe {
	f, _, err := r.run(ctx, 30*time.Second, "identity")
	if err != nil {
		return fromFinding(f, err)
	}
	kernel, _ := f.Data["kernel"].(string)
	ev := []string{f.Evidence}
	data := map[string]any{"kernel": kernel}
	pass := true
	switch {
	case r.wasm:
		pass = kernel == "wasi"
		ev = append(ev, "backend wasm: wazero runs the module in this process")
	default:
		want := map[string]string{sandbox.RuntimeRunc: "linux", sandbox.RuntimeRunsc: "gvisor"}[r.spec.Runtime]
		if kernel != want {
			pass = false
			ev = append(ev, fmt.Sprintf("runtime %s should answer as %s, answered as %s", r.spec.Runtime, want, kernel))
		}
		if r.host != nil {
			st, err := r.host.Inspect(ctx, r.rep.Sandbox.ID)
			if err != nil {
				pass = false
				ev = append(ev, "host: "+err.Error())
			} else {
				ev = append(ev, fmt.Sprintf("host: runtime %q", st.Runtime))
				data["engine_runtime"] = st.Runtime
				if st.Runtime != r.spec.Runtime {
					pass = false
				}
			}
		}
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: data}
}

// gateway listens on the host addresses a sandbox could reach the host by
// (the Inspector's: a bridge gateway) and asks the sandbox to reach them
// and its default gateway.
func (r *runner) gateway(ctx context.Context) Probe {
	if r.wasm {
		return Probe{Status: StatusNA, Evidence: "a WASI module has no sockets: the network-egress probe shows dialing fails"}
	}
	var args []string
	var hostEv []string
	var accepted []string
	var mu sync.Mutex
	var addrs []string
	if r.host != nil {
		var err error
		if addrs, err = r.host.HostAddrs(ctx); err != nil {
			hostEv = append(hostEv, "no host address to listen on: "+err.Error())
		}
	}
	var listening []string
	for _, a := range addrs {
		ln, err := net.Listen("tcp", net.JoinHostPort(a, "0"))
		if err != nil {
			hostEv = append(hostEv, fmt.Sprintf("cannot listen on the host address %s: %v", a, err))
			continue
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted = append(accepted, c.RemoteAddr().String())
				mu.Unlock()
				c.Close()
			}
		}()
		listening = append(listening, ln.Addr().String())
		hostEv = append(hostEv, "host listening on "+ln.Addr().String())
	}
	if len(listening) > 0 {
		args = append(args, "-gateways", strings.Join(listening, ","))
	}
	f, _, err := r.run(ctx, 30*time.Second, append([]string{"net-gateway"}, args...)...)
	p := fromFinding(f, err)
	time.Sleep(50 * time.Millisecond) // let the accept loop see a late connection
	mu.Lock()
	if len(accepted) > 0 {
		p.Status = StatusFail
		hostEv = append(hostEv, fmt.Sprintf("the host listener accepted connections from %v", accepted))
	}
	mu.Unlock()
	p.Evidence = strings.Join(append([]string{p.Evidence}, hostEv...), "; ")
	return p
}

func (r *runner) mounts(ctx context.Context) Probe {
	if r.wasm {
		f, _, err := r.run(ctx, 30*time.Second, "files")
		return fromFinding(f, err)
	}
	return r.simple("mounts", "-dir", r.spec.Workdir)(ctx)
}

// guest checks that a command cannot reach the guest agent, cannot kill
// it, and that replies it forges are not believed.
func (r *runner) guest(ctx context.Context) Probe {
	if r.wasm {
		return Probe{Status: StatusNA, Evidence: "no guest agent: commands run in confined helper processes (the host-filesystem, seccomp and escape-syscalls probes check them) as a shell or WASI modules, which have no processes, signals or /proc of the host to reach"}
	}
	f, res, err := r.run(ctx, 30*time.Second, "guest", "-forge")
	var ev []string
	pass := true
	switch {
	case strings.Contains(string(res.Stdout), forgedMarker):
		pass = false
		ev = append(ev, "the host believed a reply forged by the command (its stdout is the forged one)")
	case err != nil:
		pass = false
		ev = append(ev, err.Error())
	default:
		// What must hold on every runtime: no ptrace, no memory, no
		// forged reply believed, and the guest survives (below). The
		// stream itself is reachable under gVisor, whose /proc ignores the
		// guest's non-dumpable flag: replies are sealed, so a command can
		// garble the stream (failing its own sandbox) but not forge.
		reach, _ := f.Data["reachable"].(map[string]any)
		pass = reach["ptrace"] == nil && reach["/proc/1/mem"] == nil && reach["/proc/1/root/."] == nil &&
			reach["channel"] == nil && reach["inherited-socket"] == nil
		ev = append(ev, f.Evidence)
		if reach["/proc/1/fd/1"] != nil || reach["/proc/1/fd/0"] != nil {
			ev = append(ev, "WARNING: the guest's stream is reachable from a command (gVisor's /proc does not honour the guest's non-dumpable flag); replies are sealed with a per-sandbox key, so the forged ones were dropped, but a command can garble the stream and fail its own sandbox")
		}
	}
	if err := r.alive(ctx); err != nil {
		pass = false
		ev = append(ev, "the guest did not survive: "+err.Error())
	} else {
		ev = append(ev, "the guest still answers")
	}
	// A forged reply for a later request would show here.
	res2, err := r.sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{r.probe, "ping"}})
	if err == nil && strings.Contains(string(res2.Stdout), forgedMarker) {
		pass = false
		ev = append(ev, "a later request got a forged reply")
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: f.Data}
}

// forgedMarker is what the probe program's forged replies print.
const forgedMarker = "ROLLBOX-PROBE-FORGED-REPLY"

// copyOut plants symlinks to host paths in the workdir and reads them back
// through the sandbox's file API, as an episode's copy-out would, while a
// command swaps a directory and a symlink underneath (CVE-2018-15664).
func (r *runner) copyOut(ctx context.Context) Probe {
	wd := r.spec.Workdir
	links := []struct{ name, target string }{
		{"leak-shadow", "/etc/shadow"}, {"leak-root", "/"}, {"leak-relative", "../../../../../../../../etc/hostname"},
		{"leak-proc", "/proc/1/root/etc/shadow"}, {"leak-self", "/proc/self/root/etc/passwd"},
	}
	var ev []string
	if r.wasm {
		var sh strings.Builder
		for _, l := range links {
			fmt.Fprintf(&sh, "ln -s %s %s/%s; ", l.target, wd, l.name)
		}
		res, err := r.sb.Exec(ctx, sandbox.ExecRequest{Shell: sh.String()})
		if err != nil {
			return Probe{Status: StatusFail, Evidence: "planting symlinks: " + err.Error()}
		}
		ev = append(ev, fmt.Sprintf("planted %d symlinks with ln -s (exit %d)", len(links), res.ExitCode))
	} else {
		f, _, err := r.run(ctx, 30*time.Second, "plant", "-dir", wd)
		if err != nil {
			return Probe{Status: StatusFail, Evidence: "planting symlinks: " + err.Error()}
		}
		ev = append(ev, "planted: "+f.Evidence)
	}
	pass := true
	leaked := func(host string, got []byte) bool {
		want, err := os.ReadFile(host)
		return err == nil && len(want) > 0 && string(want) == string(got)
	}
	reads := []struct{ path, host string }{
		{wd + "/leak-shadow", "/etc/shadow"}, {wd + "/leak-root/etc/shadow", "/etc/shadow"},
		{wd + "/leak-root/etc/hostname", "/etc/hostname"}, {wd + "/leak-relative", "/etc/hostname"},
		{wd + "/leak-proc", "/etc/shadow"}, {wd + "/leak-self", "/etc/passwd"},
	}
	refusedN := 0
	for _, rd := range reads {
		data, err := r.sb.ReadFile(ctx, rd.path, 1<<20)
		switch {
		case err != nil:
			refusedN++
			ev = append(ev, fmt.Sprintf("ReadFile %s: %s", rd.path, errKind(err)))
		case leaked(rd.host, data):
			pass = false
			ev = append(ev, fmt.Sprintf("ReadFile %s returned the host's %s", rd.path, rd.host))
		default:
			ev = append(ev, fmt.Sprintf("ReadFile %s: %d bytes of the sandbox's own file, not the host's", rd.path, len(data)))
		}
	}
	if list, err := r.sb.ListFiles(ctx, wd+"/leak-root"); err != nil {
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root: %s", wd, errKind(err)))
	} else if sameNames(list, "/") {
		pass = false
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root listed the host's /", wd))
	} else {
		ev = append(ev, fmt.Sprintf("ListFiles %s/leak-root: %d entries of the sandbox's own root", wd, len(list)))
	}
	if !r.wasm {
		p, e := r.race(ctx)
		pass = pass && p
		ev = append(ev, e)
	}
	return Probe{Status: status(pass), Evidence: strings.Join(ev, "; "), Data: map[string]any{"refused": refusedN, "reads": len(reads)}}
}

// race reads through a path whose directory a command keeps swapping with
// a symlink to /.
func (r *runner) race(ctx context.Context) (bool, string) {
	wd := r.spec.Workdir
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.sb.Exec(rctx, sandbox.ExecRequest{Argv: []string{r.probe, "swap", "-dir", wd, "-for", "1700ms"}})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	want, _ := os.ReadFile("/etc/hostname")
	reads, inside, leaks := 0, 0, 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		data, err := r.sb.ReadFile(ctx, wd+"/race/etc/hostname", 1<<16)
		reads++
		if err == nil {
			if len(want) > 0 && string(data) == string(want) {
				leaks++
			} else {
				inside++
			}
		}
	}
	<-done
	if leaks > 0 {
		return false, fmt.Sprintf("race: %d of %d reads of %s/race/etc/hostname, while a command swapped race with a symlink to /, returned the host's /etc/hostname", leaks, reads, wd)
	}
	return true, fmt.Sprintf("race: %d reads of %s/race/etc/hostname while a command swapped race with a symlink to /: %d got the sandbox's file, the rest were refused, none the host's", reads, wd, inside)
}

func sameNames(list []sandbox.FileInfo, hostDir string) bool {
	entries, err := os.ReadDir(hostDir)
	if err != nil || len(entries) != len(list) {
		return false
	}
	for i, e := range entries {
		if list[i].Name != e.Name() {
			return false
		}
	}
	return true
}

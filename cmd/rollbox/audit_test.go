package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/internal/audit"
	"github.com/rollbox/rollbox/sandbox"
)

func TestAuditRefusesBadInputBeforeStartingAnything(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown runtime", []string{"--runtime", "crun"}, `--runtime: "crun" is not one of runc, runsc`},
		{"an unknown network", []string{"--network", "host"}, `--network: "host" is not one of none, bridge`},
		{"an unknown backend", []string{"--backend", "vm"}, `--backend "vm"`},
		{"a runtime for wasm", []string{"--backend", "wasm", "--runtime", "runsc"}, "no OCI runtime"},
		{"a task file without a task", []string{"--tasks", "../../examples/coding/tasks.jsonl"}, "--tasks and --task go together"},
		{"a task that is not there", []string{"--tasks", "../../examples/coding/tasks.jsonl", "--task", "nope"}, `--task "nope" is not in`},
		{"an unknown probe", []string{"--probes", "network-egress,escape"}, `--probes: "escape" is not a probe (runtime-identity, network-egress,`},
		{"verify-log without a file", []string{"verify-log"}, "verify-log takes the log's files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := rollbox(t, append([]string{"audit"}, tt.args...)...)
			if code != exitBadInput || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tt.want)
			}
		})
	}
}

type auditJSON struct {
	Schema   string   `json:"schema"`
	Backend  string   `json:"backend"`
	Loosened []string `json:"loosened"`
	Pass     bool     `json:"pass"`
	Spec     struct {
		Network string `json:"network"`
	} `json:"spec"`
	Probes []struct {
		Name     string `json:"name"`
		Pass     bool   `json:"pass"`
		Status   string `json:"status"`
		Evidence string `json:"evidence"`
	} `json:"probes"`
}

func decodeAudit(t *testing.T, out string) auditJSON {
	t.Helper()
	var rep auditJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if rep.Schema != "rollbox.audit/v1" || len(rep.Probes) == 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, p := range rep.Probes {
		if p.Name == "" || p.Evidence == "" || p.Pass != (p.Status == "pass") {
			t.Errorf("probe %+v: want a name, evidence and pass = (status == pass)", p)
		}
	}
	return rep
}

// wasmSameEverywhere are the WASM probes whose answer depends neither on
// how the command line opens the backend (the --audit-log wrapper the host
// view is read through) nor on a spec other than the default: each stresses
// the helper's own limits or interpreter, the same on every default WASM
// sandbox. internal/audit's TestTheWASMBackendPassesOrExplainsEveryProbe runs
// every probe, these included, on that default spec; they are also the
// slow ones: 45 of the 64 s the whole audit took at a load of 15.
var wasmSameEverywhere = []string{"memory-bypass", "memory-balloon", "disk-fill", "fifo-threads", "command-leftovers"}

// probesBut is every probe but those named, in the audit's order.
func probesBut(skip ...string) []string {
	var out []string
	for _, n := range audit.Names() {
		if !slices.Contains(skip, n) {
			out = append(out, n)
		}
	}
	return out
}

func TestAuditOfATasksWASMSandboxPassesAndLogsItsCalls(t *testing.T) {
	log := filepath.Join(t.TempDir(), "audit.jsonl")
	// The probes that read the backend's host side through the
	// --audit-log wrapper (Confiner: capabilities to host-filesystem;
	// Inspector: cpu-quota, sandbox-removed; host files: proc-self-exe,
	// host-path-oracle) and the rest of the cheap ones. The task asks for
	// the default WASM sandbox (checked below): the others' answer on it is
	// internal/audit's.
	only := probesBut(wasmSameEverywhere...)
	code, out, stderr := rollbox(t, "audit", "--tasks", "../../examples/coding/tasks.jsonl", "--task", "fix-add", "--json", "--audit-log", log,
		"--probes", strings.Join(only, ","))
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rep := decodeAudit(t, out)
	if rep.Backend != "wasm" || !rep.Pass || len(rep.Loosened) != 0 {
		t.Errorf("report backend %s pass %v loosened %v", rep.Backend, rep.Pass, rep.Loosened)
	}
	var ran []string
	for _, p := range rep.Probes {
		ran = append(ran, p.Name)
		if p.Name == "cpu-quota" && !strings.Contains(p.Evidence, "host: the helper processes") {
			t.Errorf("cpu-quota was not judged by the host's view through the audit log: %s", p.Evidence)
		}
	}
	if !slices.Equal(ran, only) {
		t.Errorf("probes %v ran, want %v", ran, only)
	}
	var full struct {
		Spec sandbox.Spec `json:"spec"`
	}
	json.Unmarshal([]byte(out), &full)
	if want := (sandbox.Spec{}).WithDefaults(); !reflect.DeepEqual(full.Spec, want) {
		t.Errorf("the task's sandbox is %+v, not the default %+v internal/audit audits with every probe", full.Spec, want)
	}
	code, out, stderr = rollbox(t, "audit", "verify-log", log)
	if code != exitOK || !strings.Contains(out, "ok: ") || !strings.Contains(out, "1 sandboxes") {
		t.Fatalf("verify-log: exit %d %q %q", code, out, stderr)
	}
	// Drop a line from the middle: verify-log names the line after it.
	b, _ := os.ReadFile(log)
	lines := strings.SplitAfter(string(b), "\n")
	os.WriteFile(log, []byte(strings.Join(append(lines[:3:3], lines[4:]...), "")), 0o600)
	code, _, stderr = rollbox(t, "audit", "verify-log", log)
	if code != exitFailure || !strings.Contains(stderr, "line 4: prev is") {
		t.Fatalf("verify-log of a log with a line deleted: exit %d %q", code, stderr)
	}
}

func TestAuditOfABridgeNetworkSaysSoAndFails(t *testing.T) {
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-audit")
	// The probes the network opens, and three it does not touch (the
	// others are the default spec's: internal/audit's
	// TestTheDefaultSpecPassesEveryProbe).
	only := []string{"network-egress", "network-gateway", "network-metadata", "network-dns", "capabilities", "mounts", "memory-balloon"}
	code, out, stderr := rollbox(t, "audit", "--network", "bridge", "--probes", strings.Join(only, ","), "--json")
	if code != exitFailure {
		t.Fatalf("exit %d, want 1: %s", code, stderr)
	}
	rep := decodeAudit(t, out)
	if rep.Pass || rep.Spec.Network != "bridge" || strings.Join(rep.Loosened, ",") != "network=bridge" {
		t.Errorf("report pass %v network %s loosened %v", rep.Pass, rep.Spec.Network, rep.Loosened)
	}
	if !strings.Contains(stderr, "WARNING: this spec loosens isolation: network=bridge") {
		t.Errorf("no warning on stderr: %s", stderr)
	}
	failed := map[string]bool{}
	var ran []string
	for _, p := range rep.Probes {
		ran = append(ran, p.Name)
		if !p.Pass {
			failed[p.Name] = true
		}
	}
	if !slices.Equal(ran, only) {
		t.Errorf("probes %v ran, want --probes' %v", ran, only)
	}
	for _, name := range []string{"network-egress", "network-gateway", "network-metadata", "network-dns"} {
		if !failed[name] {
			t.Errorf("%s passed on a bridge network", name)
		}
	}
	if failed["capabilities"] || failed["mounts"] || failed["memory-balloon"] {
		t.Errorf("probes the network does not touch failed: %v", failed)
	}
}

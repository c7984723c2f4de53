package runtime

import (
	"fmt"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/rollbox/rollbox/agent"
)

// Maxima are the most one request may ask of the service (rollbox serve
// --max-limits NAME=VALUE,...): a rollout or an environment episode asking
// for more is refused with a 400 naming the field, before anything is
// allocated. They apply to what a request sends (inline tasks, overrides,
// the policy object), not to the tasks the service was started with
// (--tasks, named by id), which are the operator's own. Zero fields take the
// defaults.
type Maxima struct {
	// Tasks in one rollout (default 10,000).
	Tasks int
	// GroupSize of one rollout (default Limits.MaxGroupSize, 4,096).
	GroupSize int
	// Episodes of one rollout, tasks × group_size (default MaxRunning +
	// MaxQueued: what the service holds at once).
	Episodes int
	// Episode limits (defaults 1,000 turns, 1 MiB of tool output shown, 1 Mi
	// context tokens, 64 MiB of output stored per command, a day per
	// episode, an hour of silence per command).
	MaxTurns, MaxToolOutputBytes, MaxContextTokens, MaxStoredOutputBytes int
	EpisodeTimeoutS, IdleTimeoutS                                        float64
	// Sandbox limits (defaults: the host's CPUs, 8 GiB of memory, 4,096
	// processes, 10 GiB of disk and 4 GiB of /tmp — on WASM the disk is held
	// in memory —, an hour per command).
	CPUs                          float64
	MemoryMB, PIDs, DiskMB, TmpMB int
	ExecTimeoutS                  float64
	// RewardTimeoutS bounds a tests reward's timeout_s (default an hour).
	RewardTimeoutS float64
	// PolicyTimeoutS bounds policy.timeout_s, PolicyMaxTokens
	// policy.sampling.max_tokens (defaults an hour, 1 Mi).
	PolicyTimeoutS  float64
	PolicyMaxTokens int
}

// maximaKeys names the fields of Maxima as --max-limits spells them.
func (m *Maxima) fields() map[string]any {
	return map[string]any{
		"tasks": &m.Tasks, "group_size": &m.GroupSize, "episodes": &m.Episodes,
		"max_turns": &m.MaxTurns, "max_tool_output_bytes": &m.MaxToolOutputBytes, "max_context_tokens": &m.MaxContextTokens,
		"max_stored_output_bytes": &m.MaxStoredOutputBytes, "episode_timeout_s": &m.EpisodeTimeoutS, "idle_timeout_s": &m.IdleTimeoutS,
		"cpus": &m.CPUs, "memory_mb": &m.MemoryMB, "pids": &m.PIDs, "disk_mb": &m.DiskMB, "tmp_mb": &m.TmpMB,
		"exec_timeout_s": &m.ExecTimeoutS, "reward_timeout_s": &m.RewardTimeoutS,
		"policy_timeout_s": &m.PolicyTimeoutS, "policy_max_tokens": &m.PolicyMaxTokens,
	}
}

// MaximaNames lists the names --max-limits takes.
func MaximaNames() []string {
	var m Maxima
	var names []string
	for k := range m.fields() {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// ParseMaxima reads NAME=VALUE,... (names as MaximaNames lists them).
func ParseMaxima(spec string) (Maxima, error) {
	var m Maxima
	fields := m.fields()
	for _, kv := range strings.Split(spec, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		p := fields[strings.TrimSpace(k)]
		if !ok || p == nil {
			return m, fmt.Errorf("%q: want NAME=VALUE with NAME one of %s", kv, strings.Join(MaximaNames(), ", "))
		}
		v = strings.TrimSpace(v)
		switch p := p.(type) {
		case *int:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return m, fmt.Errorf("%s=%s: want a positive integer", k, v)
			}
			*p = n
		case *float64:
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 1e12 {
				return m, fmt.Errorf("%s=%s: want a positive number", k, v)
			}
			*p = f
		}
	}
	return m, nil
}

func (m Maxima) withDefaults(l Limits) Maxima {
	setInt := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	setFloat := func(p *float64, v float64) {
		if *p <= 0 {
			*p = v
		}
	}
	setInt(&m.Tasks, 10000)
	setInt(&m.GroupSize, l.MaxGroupSize)
	setInt(&m.Episodes, l.MaxRunning+l.MaxQueued)
	setInt(&m.MaxTurns, 1000)
	setInt(&m.MaxToolOutputBytes, 1<<20)
	setInt(&m.MaxContextTokens, 1<<20)
	setInt(&m.MaxStoredOutputBytes, 64<<20)
	setFloat(&m.EpisodeTimeoutS, 86400)
	setFloat(&m.IdleTimeoutS, 3600)
	setFloat(&m.CPUs, float64(goruntime.NumCPU()))
	setInt(&m.MemoryMB, 8192)
	setInt(&m.PIDs, 4096)
	setInt(&m.DiskMB, 10240)
	setInt(&m.TmpMB, 4096)
	setFloat(&m.ExecTimeoutS, 3600)
	setFloat(&m.RewardTimeoutS, 3600)
	setFloat(&m.PolicyTimeoutS, 3600)
	setInt(&m.PolicyMaxTokens, 1<<20)
	return m
}

// overMax is the 400 of a field past its maximum.
func overMax(field string, v, max any, name string) error {
	return badField(field, "%v is above this service's maximum of %v (rollbox serve --max-limits %s=...)", v, max, name)
}

// checkTask refuses a task (as it will run: overrides applied) that asks
// for more than the maxima; field prefixes the field named ("tasks[3]").
func (m Maxima) checkTask(t *agent.Task, field string) error {
	l := t.Limits
	ints := []struct {
		name, path string
		v, max     int
	}{
		{"max_turns", "limits.max_turns", l.MaxTurns, m.MaxTurns},
		{"max_tool_output_bytes", "limits.max_tool_output_bytes", l.MaxToolOutputBytes, m.MaxToolOutputBytes},
		{"max_context_tokens", "limits.max_context_tokens", l.MaxContextTokens, m.MaxContextTokens},
		{"max_stored_output_bytes", "limits.max_stored_output_bytes", l.MaxStoredOutputBytes, m.MaxStoredOutputBytes},
		{"memory_mb", "sandbox.limits.memory_mb", t.Sandbox.Limits.MemoryMB, m.MemoryMB},
		{"pids", "sandbox.limits.pids", t.Sandbox.Limits.PIDs, m.PIDs},
		{"disk_mb", "sandbox.limits.disk_mb", t.Sandbox.Limits.DiskMB, m.DiskMB},
		{"tmp_mb", "sandbox.limits.tmp_mb", t.Sandbox.Limits.TmpMB, m.TmpMB},
	}
	for _, c := range ints {
		if c.v > c.max {
			return overMax(join(field, c.path), c.v, c.max, c.name)
		}
	}
	floats := []struct {
		name, path string
		v, max     float64
	}{
		{"episode_timeout_s", "limits.episode_timeout_s", l.EpisodeTimeoutS, m.EpisodeTimeoutS},
		{"idle_timeout_s", "limits.idle_timeout_s", l.IdleTimeoutS, m.IdleTimeoutS},
		{"cpus", "sandbox.limits.cpus", t.Sandbox.Limits.CPUs, m.CPUs},
		{"exec_timeout_s", "sandbox.limits.exec_timeout_s", t.Sandbox.Limits.ExecTimeoutS, m.ExecTimeoutS},
		{"reward_timeout_s", "reward.timeout_s", t.Reward.TimeoutS, m.RewardTimeoutS},
	}
	for _, c := range floats {
		if c.v > c.max {
			return overMax(join(field, c.path), c.v, c.max, c.name)
		}
	}
	return nil
}

package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestValidateNamesTheOffendingField(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		field string
	}{
		{"an unknown runtime", Spec{Runtime: "kata"}, "runtime"},
		{"an unknown network", Spec{Network: "host"}, "network"},
		{"an image with whitespace", Spec{Image: "python 3"}, "image"},
		{"docker: with no name", Spec{Image: "docker:"}, "image"},
		{"negative cpus", Spec{Limits: Limits{CPUs: -1}}, "limits.cpus"},
		{"too little memory", Spec{Limits: Limits{MemoryMB: 2}}, "limits.memory_mb"},
		{"too few pids", Spec{Limits: Limits{PIDs: 3}}, "limits.pids"},
		{"a negative disk", Spec{Limits: Limits{DiskMB: -1}}, "limits.disk_mb"},
		{"a negative timeout", Spec{Limits: Limits{ExecTimeout: -time.Second}}, "limits.exec_timeout"},
		{"a relative workdir", Spec{Workdir: "work"}, "workdir"},
		{"the root as workdir", Spec{Workdir: "/"}, "workdir"},
		{"an unclean workdir", Spec{Workdir: "/work/../etc"}, "workdir"},
		{"the guest's directory as workdir", Spec{Workdir: "/.rollbox"}, "workdir"},
		{"the channel as workdir", Spec{Workdir: "/.rollbox/channel"}, "workdir"},
		{"/proc as workdir", Spec{Workdir: "/proc"}, "workdir"},
		{"the cgroups as workdir", Spec{Workdir: "/sys/fs/cgroup"}, "workdir"},
		{"/dev as workdir", Spec{Workdir: "/dev/shm"}, "workdir"},
		{"an env name with =", Spec{Env: map[string]string{"A=B": "x"}}, "env"},
		{"an env value with NUL", Spec{Env: map[string]string{"A": "x\x00"}}, "env.A"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("err = %v, want a FieldError for %s", err, tt.field)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("message %q does not name %s", err, tt.field)
			}
		})
	}
}

func TestTheZeroSpecIsHardened(t *testing.T) {
	s := Spec{}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	d := s.WithDefaults()
	if d.Network != NetworkNone || d.Runtime != RuntimeRunc || d.Workdir != "/work" || d.Limits.MemoryMB == 0 || d.Limits.PIDs == 0 {
		t.Errorf("defaults = %+v", d)
	}
	if l := s.Loosened(); len(l) != 0 {
		t.Errorf("Loosened() = %v", l)
	}
	if l := (Spec{Network: NetworkBridge}).Loosened(); len(l) != 1 || l[0] != "network=bridge" {
		t.Errorf("Loosened() = %v", l)
	}
	if (Spec{}).Key() != (Spec{Workdir: "/work"}).Key() {
		t.Errorf("keys differ for specs equal after defaults")
	}
}

func TestExecRequestValidate(t *testing.T) {
	for _, r := range []ExecRequest{{}, {Argv: []string{"a"}, Shell: "b"}, {Argv: []string{""}}, {Shell: "x", Timeout: -1}, {Shell: "x", Env: map[string]string{"": "v"}}} {
		if err := r.Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%+v: err = %v", r, err)
		}
	}
	if err := (ExecRequest{Shell: "true"}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestAnAbuseErrorIsNeverInfrastructure(t *testing.T) {
	abuse := fmt.Errorf("wasm-1: helper died: %w (%w)", ErrSandboxAbuse, ErrSandboxFailed)
	if IsInfra(abuse) {
		t.Fatal("IsInfra(abuse) = true: a sandbox the agent broke would be dropped instead of scored")
	}
	if !IsAbuse(abuse) {
		t.Fatal("IsAbuse(abuse) = false")
	}
	failed := fmt.Errorf("engine gone: %w", ErrSandboxFailed)
	if !IsInfra(failed) || IsAbuse(failed) {
		t.Fatalf("a plain sandbox failure: IsInfra=%v IsAbuse=%v, want true, false", IsInfra(failed), IsAbuse(failed))
	}
}

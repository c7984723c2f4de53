package main

import (
	"strings"
	"testing"
)

func TestExecPassesTheCommandsOutputAndStatusThrough(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{"a shell line on the default backend", []string{"exec", "--", "sh", "-c", "echo hi | wc -c"}, 0, "3\n", ""},
		{"a failing command keeps its status", []string{"exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7"}, 7, "out\n", "err\n"},
		{"python on the default backend", []string{"exec", "--", "python", "-c", "print(6*7)"}, 0, "42\n", ""},
		{"js on the default backend", []string{"exec", "--", "js", "-e", "console.log([1,2,3].length)"}, 0, "3\n", ""},
		{"a timeout is reported", []string{"exec", "--timeout", "200ms", "--", "sh", "-c", "sleep 10"}, 137, "", "timed out"},
		{"no command is bad input", []string{"exec"}, exitBadInput, "", "no command given"},
		{"an unknown runtime is bad input", []string{"exec", "--runtime", "kata", "--", "true"}, exitBadInput, "", `runtime: "kata" is not one of runc, runsc`},
		{"an unknown backend is bad input", []string{"exec", "--backend", "vm", "--", "true"}, exitBadInput, "", `backend "vm"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := rollbox(t, tt.args...)
			if code != tt.code || stdout != tt.stdout || !strings.Contains(stderr, tt.stderrPart) {
				t.Fatalf("exit %d stdout %q stderr %q; want %d %q %q", code, stdout, stderr, tt.code, tt.stdout, tt.stderrPart)
			}
		})
	}
}

func TestExecOnDockerAndAMissingImage(t *testing.T) {
	needDocker(t)
	code, stdout, stderr := rollbox(t, "exec", "--backend", "docker", "--", "sh", "-c", "id -u; exit 3")
	if code != 3 || stdout != "65534\n" {
		t.Fatalf("exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	code, _, stderr = rollbox(t, "exec", "--backend", "docker", "--image", "docker:no-such-image:v0", "--", "true")
	if code != exitSandboxFailed || !strings.Contains(stderr, "no-such-image") {
		t.Fatalf("exit %d stderr %q, want 125 naming the image", code, stderr)
	}
}

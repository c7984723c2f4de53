package docker_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

func TestImageIDIsWhatInfoReportsAndAMissingImageSaysHowToMakeIt(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	id, err := b.ImageID(ctx, "base")
	if err != nil || id != sb.Info().ImageDigest {
		t.Fatalf("ImageID(base) = %q, %v; Info says %q", id, err, sb.Info().ImageDigest)
	}
	if byID, err := b.ImageID(ctx, "docker:"+id); err != nil || byID != id {
		t.Errorf("ImageID by its own id = %q, %v", byID, err)
	}
	_, err = b.ImageID(ctx, "docker:rollbox-test/absent:1")
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "rollbox-test/absent:1") {
		t.Errorf("missing image: %v", err)
	}
}

func TestAPinnedHostnameReplacesTheContainerID(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Hostname: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "hostname"})
	if err != nil || string(res.Stdout) != "sandbox\n" {
		t.Errorf("hostname = %q, %v", res.Stdout, err)
	}
}

func TestShellRunsInteractivelyInTheSandboxWithAndWithoutATerminal(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.WriteFile(ctx, "/work/f.txt", []byte("seeded\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tty := range []bool{false, true} {
		var out bytes.Buffer
		code, err := sb.(*docker.Container).Shell(ctx, docker.ShellOptions{
			Stdin: strings.NewReader("echo $GREETING; pwd; cat f.txt; id -u; exit 3\n"), Stdout: &out, TTY: tty, Width: 80, Height: 24,
		})
		if err != nil || code != 3 {
			t.Fatalf("tty=%v: exit %d, %v; output %q", tty, code, err, out.String())
		}
		got := strings.ReplaceAll(out.String(), "\r", "")
		for _, want := range []string{"hi\n", "/work\n", "seeded\n", "65534\n"} {
			if !strings.Contains(got, want) {
				t.Errorf("tty=%v: output %q lacks %q", tty, got, want)
			}
		}
	}
}

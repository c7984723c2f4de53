package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
	"github.com/rollbox/rollbox/sandbox/wasm/wasmtest"
)

// The reward hacks of verifier_attack_test.go on the backends and sandboxes
// that came after them: containerd, and sandboxes that are forks (a
// prefixed group's episodes and share_workspace sub-agents run in forks;
// a fork's files sit on a layer shared with its parent and siblings).
// Every attack must still score 0, the honest fix 1.

var (
	containerdGuest = sync.OnceValues(func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		return images.NewBuilder(os.Stderr).Build(ctx, images.Target{Package: "images/guest", GOOS: "linux", GOARCH: "amd64", Name: "guest"})
	})
)

// needContainerdBackend is a containerd backend of the test's own (its own
// owner: what it leaves is removed at the test's end, and nothing of the
// tests beside it), skipping without containerd and its python image,
// failing under CI=true.
func needContainerdBackend(t *testing.T) *containerd.Backend {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("containerd and its python image required under CI=true: %s", why)
		}
		t.Skipf("no containerd: %s", why)
	}
	guest, err := containerdGuest()
	if err != nil {
		skip("building the guest agent: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	owner := fmt.Sprintf("%s-%s", dockerTestOwner, t.Name())
	be, err := containerd.New(ctx, containerd.Options{GuestPath: guest, Owner: owner})
	if err != nil {
		skip(err.Error())
	}
	t.Cleanup(func() {
		be.Close()
		containerd.Cleanup(context.Background(), be.Client(), owner)
	})
	sb, err := be.Create(ctx, sandbox.Spec{Image: "python"})
	if err != nil {
		skip("a python container does not start on containerd (rollbox images build python --backend containerd): " + err.Error())
	}
	sb.Close()
	return be
}

// forkFactory makes every sandbox as a fork of a parent of the same spec,
// one parent per spec, kept open for the test: the attacks' sandboxes and
// their verifiers' are siblings of each other and children of the parent.
// The parent holds a file of its own; at the end it must hold what it held
// when it was made (no child's write reached it).
func forkFactory(t *testing.T, create func(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error)) agent.SandboxFactory {
	var mu sync.Mutex
	type parent struct {
		sb    sandbox.Sandbox
		files map[string][]string
	}
	parents := map[string]*parent{}
	list := func(ctx context.Context, sb sandbox.Sandbox) (map[string][]string, error) {
		out := map[string][]string{}
		for _, dir := range []string{sb.Info().Workdir, "/tmp"} {
			l, err := sb.ListFiles(ctx, dir)
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", dir, err)
			}
			for _, fi := range l {
				out[dir] = append(out[dir], fmt.Sprintf("%s %d", fi.Name, fi.Size))
			}
		}
		return out, nil
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for key, p := range parents {
			after, err := list(ctx, p.sb)
			if err != nil {
				t.Errorf("the parent (%s): %v", key, err)
			} else if fmt.Sprint(after) != fmt.Sprint(p.files) {
				t.Errorf("the parent's files changed while its children ran: %v, was %v", after, p.files)
			}
			if b, err := p.sb.ReadFile(ctx, p.sb.Info().Workdir+"/parent.txt", 1<<10); err != nil || string(b) != "the parent's\n" {
				t.Errorf("the parent's own file: %q %v", b, err)
			}
			p.sb.Close()
		}
	})
	return func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		key := spec.WithDefaults().Key()
		mu.Lock()
		defer mu.Unlock()
		p := parents[key]
		if p == nil {
			sb, err := create(ctx, spec)
			if err != nil {
				return nil, err
			}
			if err := sb.WriteFile(ctx, sb.Info().Workdir+"/parent.txt", []byte("the parent's\n"), 0o644); err != nil {
				sb.Close()
				return nil, err
			}
			files, err := list(ctx, sb)
			if err != nil {
				sb.Close()
				return nil, err
			}
			p = &parent{sb: sb, files: files}
			parents[key] = p
		}
		f, ok := sandbox.Find[sandbox.Forker](p.sb)
		if !ok {
			return nil, fmt.Errorf("the %s backend cannot fork: %w", p.sb.Info().Backend, sandbox.ErrInvalidSpec)
		}
		kids, err := f.Fork(ctx, 1)
		if err != nil {
			return nil, err
		}
		return kids[0], nil
	}
}

// On containerd every attack (the attacks on the verifier's logic for the
// containerd engine: gVisor on containerd and containerd forks run only
// the runtime-dependent ones): the runtime-dependent attacks on the legacy
// shape (the named one runs on containerd forks, on the same runtime), the
// attacks on the verifier's logic on the named shape (the legacy one is
// runc's on Docker: the same verifier, the same runtime), both where the
// legacy one is weak and for the controls. ROLLBOX_ATTACK_ALL=1 runs every
// attack on both.
func TestTheVerifierResistsRewardHacksOnContainerd(t *testing.T) {
	t.Parallel() // containerd's sandboxes, beside the Docker and WASM tests
	be := needContainerdBackend(t)
	f := func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		return be.Create(ctx, spec)
	}
	list := recommended(attacks)
	for i, a := range list {
		if len(a.weak) > 0 || a.want != 0 || a.turns == nil || os.Getenv("ROLLBOX_ATTACK_ALL") == "1" {
			continue
		}
		drop := "pytest"
		if _, dep := runtimeDependent[a.name]; dep {
			drop = "pytest-named"
		}
		list[i].shapes = slices.DeleteFunc(slices.Clone(a.shapes), func(s string) bool { return s == drop })
	}
	runAttacks(t, list, map[string]func() (*agent.Task, agent.SandboxFactory){
		"pytest": func() (*agent.Task, agent.SandboxFactory) { return onContainerd(attackTask(t, "pytest", "runc")), f },
		"pytest-named": func() (*agent.Task, agent.SandboxFactory) {
			return onContainerd(attackTask(t, "pytest-named", "runc")), f
		},
	})
}

// On gVisor on containerd (runsc as the runc shim's binary): the named
// shape, with the attacks only gVisor lets through (a command there can
// kill, freeze or garble the guest and write into its log) and the
// controls. Every attack 0, the honest fix 1, none unscored. The
// runtime-dependent attacks (runtimeDependent) run on gVisor on Docker,
// the same runtime; the attacks on the verifier's logic are containerd's
// with runc (the same engine). ROLLBOX_ATTACK_ALL=1 runs them all here too
// (all 33 held: 0, the honest fix 1; 119 s; the 13 runtime-dependent ones
// alone held too, 0 each, 78 s at a load of 27-31).
func TestTheVerifierResistsRewardHacksOnGVisorOnContainerd(t *testing.T) {
	t.Parallel()
	be := needContainerdBackend(t)
	f := func(ctx context.Context, _ string, spec sandbox.Spec) (sandbox.Sandbox, error) {
		return be.Create(ctx, spec)
	}
	list := append([]attack{}, gvisorAttacks...)
	for _, a := range attacks {
		if a.turns == nil || a.want == 1 || os.Getenv("ROLLBOX_ATTACK_ALL") == "1" {
			list = append(list, a)
		}
	}
	runAttacks(t, recommended(list), map[string]func() (*agent.Task, agent.SandboxFactory){
		"pytest-named": func() (*agent.Task, agent.SandboxFactory) {
			return onContainerd(attackTask(t, "pytest-named", "runsc")), f
		},
	})
}

// On containerd forks (copy-on-write layers shared with the parent and
// every sibling: the attacks run side by side, children of one parent) the
// named shape, as on gVisor. A fork changes what the runtime-dependent
// attacks work through and nothing else: the workdir and /tmp (an overlay
// on the parent's frozen layer, with an upper of its own and the spec's
// size), and the sandbox (a spare whose directories are swapped in,
// processes not forked). Those and the controls run here, the verifier's
// own logic on containerd (TestTheVerifierResistsRewardHacksOnContainerd:
// the same engine, the same verifier); all with ROLLBOX_ATTACK_ALL=1.
func TestTheVerifierResistsRewardHacksOnContainerdForks(t *testing.T) {
	t.Parallel()
	be := needContainerdBackend(t)
	f := forkFactory(t, be.Create)
	runAttacks(t, recommended(runtimeSet(attacks)), map[string]func() (*agent.Task, agent.SandboxFactory){
		"pytest-named": func() (*agent.Task, agent.SandboxFactory) {
			return onContainerd(attackTask(t, "pytest-named", "runc")), f
		},
	})
}

// On WASM forks (copy-on-write clones of the parent's files) the controls
// and the runtime-dependent attacks, the ones that work through the files
// a fork shares; the verifier's logic runs on WASM
// (TestTheVerifierResistsRewardHacksOnWASM, every attack on every shape);
// all with ROLLBOX_ATTACK_ALL=1.
func TestTheVerifierResistsRewardHacksOnWASMForks(t *testing.T) {
	t.Parallel()
	be := wasmtest.Backend(t)
	f := forkFactory(t, be.Create)
	runAttacks(t, recommended(runtimeSet(attacks)), map[string]func() (*agent.Task, agent.SandboxFactory){
		"wasm-py":     func() (*agent.Task, agent.SandboxFactory) { return attackTask(t, "wasm-py", ""), f },
		"wasm-js":     func() (*agent.Task, agent.SandboxFactory) { return attackTask(t, "wasm-js", ""), f },
		"wasm-py-tap": func() (*agent.Task, agent.SandboxFactory) { return attackTask(t, "wasm-py-tap", ""), f },
		"wasm-js-tap": func() (*agent.Task, agent.SandboxFactory) { return attackTask(t, "wasm-js-tap", ""), f },
	})
}

// onContainerd moves a docker task to the containerd backend.
func onContainerd(task *agent.Task) *agent.Task {
	task.Sandbox.Backend = "containerd"
	return task
}

package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/containerd"
)

// A fork's children hold the parent's files (workdir, /tmp; links as
// links, never read through), each writes only its own copy, the parent
// goes on, and nothing is left once all are closed.
func TestForkCopiesFilesNotProcessesAndChildrenAreIndependent(t *testing.T) {
	b := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	setup := `mkdir -p /work/src/empty && printf 'v1' > /work/src/a.txt && chmod 751 /work/src/a.txt &&
		ln -s /etc/hostname /work/host-link && ln -s /proc/1/root /work/root-link && echo tmp > /tmp/t;
		sleep 1000 > /dev/null 2>&1 &`
	if r, err := parent.Exec(ctx, sandbox.ExecRequest{Shell: setup}); err != nil || r.ExitCode != 0 {
		t.Fatalf("setup: %v %+v", err, r)
	}
	kids, err := parent.(sandbox.Forker).Fork(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	infos := []sandbox.Info{parent.Info()}
	for i, k := range kids {
		infos = append(infos, k.Info())
		r, err := k.Exec(ctx, sandbox.ExecRequest{Shell: `cat /work/src/a.txt; echo; stat -c '%a %u' /work/src/a.txt /work /tmp; readlink /work/host-link; readlink /work/root-link; cat /tmp/t; ls -d /work/src/empty; ps -o args | grep '^sleep 1000' | wc -l`})
		if err != nil {
			t.Fatal(err)
		}
		want := "v1\n751 65534\n755 65534\n1777 65534\n/etc/hostname\n/proc/1/root\ntmp\n/work/src/empty\n0\n"
		if string(r.Stdout) != want {
			t.Errorf("child %d sees:\n%s(stderr %s), want:\n%s", i, r.Stdout, r.Stderr, want)
		}
		if _, err := k.Exec(ctx, sandbox.ExecRequest{Shell: "printf 'child" + string(rune('0'+i)) + "' > /work/src/a.txt; rm /tmp/t"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range kids {
		got, err := k.ReadFile(ctx, "/work/src/a.txt", 0)
		if err != nil || string(got) != "child"+string(rune('0'+i)) {
			t.Errorf("child %d reads %q, %v", i, got, err)
		}
	}
	if got, err := parent.ReadFile(ctx, "/work/src/a.txt", 0); err != nil || string(got) != "v1" {
		t.Errorf("the parent reads %q, %v after its children wrote", got, err)
	}
	if got, err := parent.ReadFile(ctx, "/tmp/t", 0); err != nil || string(got) != "tmp\n" {
		t.Errorf("the parent's /tmp/t: %q, %v", got, err)
	}
	// A child's disk is its spec's: writes beyond it fail with ENOSPC.
	r, err := kids[0].Exec(ctx, sandbox.ExecRequest{Shell: "dd if=/dev/zero of=/work/big bs=1M count=20 2>&1; echo rc=$?"})
	if err != nil || !strings.Contains(string(r.Stdout), "No space left") {
		t.Errorf("a child's workdir is not limited to 8 MB: %v %s", err, r.Stdout)
	}
	if err := sandbox.CloseAll(append(kids, parent)); err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if left := remains(t, info); len(left) > 0 {
			t.Errorf("after close, %s left %v", info.ID, left)
		}
	}
	if m := b.Mounts(); len(m) > 0 {
		t.Errorf("fork mounts left: %v", m)
	}
}

// A fork that cannot be made whole makes nothing: no child is left
// running, and the error is the infrastructure's.
func TestAFailedForkLeavesNoChild(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	before := countContainers(t, b)
	// The parent's task is gone: the copy cannot read its files.
	if err := parent.(interface{ KillTask(context.Context) error }).KillTask(ctx); err != nil {
		t.Fatal(err)
	}
	kids, err := parent.(sandbox.Forker).Fork(ctx, 4)
	if err == nil {
		sandbox.CloseAll(kids)
		t.Fatal("a fork of a dead sandbox succeeded")
	}
	if !sandbox.IsInfra(err) {
		t.Errorf("error %v is not infrastructure", err)
	}
	if after := countContainers(t, b); after != before {
		t.Errorf("%d containers before the failed fork, %d after", before, after)
	}
}

// countContainers counts the containers of the tests' owner: the
// namespace's other containers (another package's tests, the agent's on
// containerd, beside these under go test ./...) come and go on their own
// (a count of all once read 10 before a failed fork and 9 after).
func countContainers(t *testing.T, b *containerd.Backend) int {
	list, err := b.Client().Containers(context.Background(), fmt.Sprintf("labels.%q==%q", containerd.LabelOwner, testOwner))
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// Forks share the parent's files without copying them, and no sandbox
// sees another's writes after the fork, whichever way the files were
// carried: frozen in place (the parent's layer made read-only under a new
// one), copied once (a file open for writing in the parent keeps its
// layer writable), or flattened (layers stacked past the limit); forks of
// forks too. Deleted files stay deleted, and every disk stays its spec's.
func TestForkLayersKeepEverySandboxsFilesItsOwn(t *testing.T) {
	b := need(t)
	defer containerd.SetMaxLayers(3)()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	parent, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 8}})
	if err != nil {
		t.Fatal(err)
	}
	var all []sandbox.Sandbox
	defer func() { sandbox.CloseAll(append(all, parent)) }()
	run := func(sb sandbox.Sandbox, shell string) string {
		t.Helper()
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: shell})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: %v %+v %s", shell, err, r, r.Stderr)
		}
		return string(r.Stdout)
	}
	fork := func(sb sandbox.Sandbox) sandbox.Sandbox {
		t.Helper()
		kids, err := sb.(sandbox.Forker).Fork(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, kids...)
		return kids[0]
	}
	const show = `for f in a b c log; do printf '%s=%s\n' $f "$(cat /work/$f 2>/dev/null || echo -)"; done`

	// A command running in the parent holds /work/log open for writing
	// while it forks: the files are copied, and what it writes after the
	// fork stays the parent's.
	run(parent, `echo v1 > /work/a; echo one > /work/log`)
	writer := make(chan error, 1)
	go func() {
		_, err := parent.Exec(ctx, sandbox.ExecRequest{Shell: `exec 3>>/work/log; touch /tmp/ready; i=0; while [ $i -lt 150 ]; do echo more >&3; sleep 0.01; i=$((i+1)); done`})
		writer <- err
	}()
	for {
		if _, err := parent.ReadFile(ctx, "/tmp/ready", 0); err == nil {
			break
		}
		select {
		case err := <-writer:
			t.Fatalf("the writer ended before it was ready: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	copied := fork(parent)
	if got := run(copied, show); !strings.HasPrefix(got, "a=v1\nb=-\nc=-\nlog=one\n") {
		t.Errorf("a fork while a file is open for writing sees:\n%s", got)
	}
	if got := run(copied, `a=$(wc -l < /work/log); sleep 0.2; b=$(wc -l < /work/log); echo $a $b`); len(strings.Fields(got)) != 2 || strings.Fields(got)[0] != strings.Fields(got)[1] {
		t.Errorf("the parent's writer still writes into its fork's log: %s", got)
	}
	if err := <-writer; err != nil {
		t.Fatal(err)
	}
	const fstype = `grep ' /work ' /proc/self/mountinfo | tail -1 | sed 's/.* - \([^ ]*\) .*/\1/'`
	if got := run(parent, fstype); got != "tmpfs\n" {
		t.Errorf("the parent's workdir is %q after a fork that copied, want its tmpfs as it was", got)
	}

	// No writer now: the parent's layer is frozen in place.
	run(parent, `echo one > /work/log; echo v2 > /work/b`)
	frozen := fork(parent)
	if got := run(parent, fstype); got != "overlay\n" {
		t.Errorf("the parent's workdir is %q after a fork that froze its layer, want an overlay", got)
	}
	run(parent, `echo v3 > /work/a; rm /work/b`)
	run(frozen, `echo k > /work/c`)
	if got, want := run(frozen, show), "a=v1\nb=v2\nc=k\nlog=one\n"; got != want {
		t.Errorf("a fork sees:\n%s\nwant:\n%s", got, want)
	}
	if got, want := run(parent, show), "a=v3\nb=-\nc=-\nlog=one\n"; got != want {
		t.Errorf("the parent sees:\n%s\nwant:\n%s", got, want)
	}
	if got, want := run(copied, show), "a=v1\nb=-\nc=-\nlog="; !strings.HasPrefix(got, want) {
		t.Errorf("the first fork sees:\n%s\nwant:\n%s", got, want)
	}
	// A fork of a fork carries the fork's own writes.
	grandchild := fork(frozen)
	if got, want := run(grandchild, show), "a=v1\nb=v2\nc=k\nlog=one\n"; got != want {
		t.Errorf("a fork of a fork sees:\n%s\nwant:\n%s", got, want)
	}
	// Past the layer limit a fork flattens: the deletion holds.
	for range 3 {
		fork(parent)
	}
	flat := fork(parent)
	if got, want := run(flat, show), "a=v3\nb=-\nc=-\nlog=one\n"; got != want {
		t.Errorf("a flattened fork sees:\n%s\nwant:\n%s", got, want)
	}
	// Each disk is still 8 MB: the parent's, after its forks, and a
	// fork's.
	for name, sb := range map[string]sandbox.Sandbox{"parent": parent, "grandchild": grandchild, "flat": flat} {
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "dd if=/dev/zero of=/work/big bs=1M count=20 2>&1; echo rc=$?"})
		if err != nil || !strings.Contains(string(r.Stdout), "No space left") {
			t.Errorf("the %s's workdir is not limited to 8 MB: %v %s", name, err, r.Stdout)
		}
	}
	if err := sandbox.CloseAll(append(all, parent)); err != nil {
		t.Fatal(err)
	}
	all, parent = nil, nil
	if m := b.Mounts(); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
}

// A fork takes the backend's spares of the spec when it has them.
func TestForkTakesSpares(t *testing.T) {
	b := need(t)
	ctx := context.Background()
	spec := sandbox.Spec{Image: "base", Labels: map[string]string{"rollbox.test": "spares"}}
	parent, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	b.SpareForks(spec, 2)
	deadline := time.Now().Add(time.Minute)
	for b.SparesReady(spec) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after a minute", b.SparesReady(spec))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := parent.WriteFile(ctx, "/work/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	kids, err := parent.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sandbox.CloseAll(kids)
	if n := b.SparesReady(spec); n != 0 {
		t.Errorf("%d spares left after a fork of 2", n)
	}
	for _, k := range kids {
		if got, err := k.ReadFile(ctx, "/work/f", 0); err != nil || string(got) != "x" {
			t.Errorf("%s reads %q, %v", k.Info().ID, got, err)
		}
	}
}

// waitSpares waits until n spares of spec are ready.
func waitSpares(t *testing.T, b *containerd.Backend, spec sandbox.Spec, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for b.SparesReady(spec) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after a minute, want %d", b.SparesReady(spec), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// containerIDs are the ids of the containers in the backend's namespace.
func containerIDs(t *testing.T, b *containerd.Backend) map[string]bool {
	t.Helper()
	list, err := b.Client().Containers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range list {
		ids[c.ID()] = true
	}
	return ids
}

// With Options.ForkSpares a fork leaves spares of its spec behind, and they
// serve the next fork of any sandbox of that spec, whatever its labels
// (every episode's sandbox has labels of its own): the second fork's
// children are containers that existed before it, none created for it.
func TestForkSparesServeTheForksOfEveryEpisodeOfTheSpec(t *testing.T) {
	b := newBackend(t, containerd.Options{ForkSpares: 2})
	ctx := context.Background()
	specA := sandbox.Spec{Image: "base", Labels: sandbox.EpisodeLabels("ep-a", "r-1")}
	specB := sandbox.Spec{Image: "base", Labels: sandbox.EpisodeLabels("ep-b", "r-1")}
	a, err := b.Create(ctx, specA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	kidsA, err := a.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sandbox.CloseAll(kidsA)
	waitSpares(t, b, specB, 2)
	bb, err := b.Create(ctx, specB)
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	if err := bb.WriteFile(ctx, "/work/f", []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := containerIDs(t, b)
	kidsB, err := bb.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sandbox.CloseAll(kidsB)
	for _, k := range kidsB {
		if !before[k.Info().ID] {
			t.Errorf("child %s of episode b's fork was created cold, not taken from the spares", k.Info().ID)
		}
		if got, err := k.ReadFile(ctx, "/work/f", 0); err != nil || string(got) != "b" {
			t.Errorf("%s reads %q, %v", k.Info().ID, got, err)
		}
	}
}

// PrepareFork makes min(n, ForkSpares) spares ahead of the first fork.
func TestPrepareForkMakesSparesAheadOfTheFirstFork(t *testing.T) {
	b := newBackend(t, containerd.Options{ForkSpares: 2})
	ctx := context.Background()
	spec := sandbox.Spec{Image: "base", Labels: map[string]string{"rollbox.test": "prepare"}}
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	p, ok := sandbox.Find[sandbox.ForkPreparer](sb)
	if !ok {
		t.Fatal("a containerd sandbox is not a sandbox.ForkPreparer")
	}
	p.PrepareFork(5)
	waitSpares(t, b, spec, 2)
	before := containerIDs(t, b)
	kids, err := sb.(sandbox.Forker).Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sandbox.CloseAll(kids)
	for _, k := range kids {
		if !before[k.Info().ID] {
			t.Errorf("child %s was created cold", k.Info().ID)
		}
	}
}

// Spares no fork takes for SpareIdle are closed: a rollout that forked
// once holds no containers for the rest of the backend's life.
func TestIdleSparesAreClosed(t *testing.T) {
	b := newBackend(t, containerd.Options{ForkSpares: 1, SpareIdle: time.Second})
	spec := sandbox.Spec{Image: "base", Labels: map[string]string{"rollbox.test": "idle"}}
	b.SpareForks(spec, 1)
	waitSpares(t, b, spec, 1)
	if n := ownContainers(t, b, t.Name()); n != 1 {
		t.Fatalf("%d containers for 1 spare", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b.SparesReady(spec) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a spare is still kept 30 s after it went idle")
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(30 * time.Second)
	for ownContainers(t, b, t.Name()) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle spare's container is still there")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A fork's files count against its disk limit, as a Docker fork's (copied
// into a tmpfs of disk_mb) and a WASM fork's (charged from the parent's
// usage) do: the layers a sandbox sees together hold at most its disk_mb.
// Before, every child and the forked parent got a fresh empty upper of
// disk_mb above the frozen files, so each fork of a chain (fork, write,
// fork the child, ...) added disk_mb more of host memory to one live
// sandbox.
func TestAForkChainStaysWithinTheDiskLimit(t *testing.T) {
	b := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 16}})
	if err != nil {
		t.Fatal(err)
	}
	var all []sandbox.Sandbox
	defer func() { sandbox.CloseAll(append(all, sb)) }()
	// write fills what it can of 12 MB and says how many KB the workdir
	// then holds.
	write := func(sb sandbox.Sandbox, name string) int {
		t.Helper()
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "dd if=/dev/zero of=/work/" + name + " bs=1M count=12 2>/dev/null; du -sk /work | cut -f1"})
		if err != nil {
			t.Fatal(err)
		}
		var mb int
		fmt.Sscan(string(r.Stdout), &mb)
		return mb
	}
	if kb := write(sb, "gen0"); kb < 12<<10 || kb > 13<<10 {
		t.Fatalf("the first sandbox's workdir holds %d KB, want its 12 MB file", kb)
	}
	cur := sb
	for gen := 1; gen <= 3; gen++ {
		kids, err := cur.(sandbox.Forker).Fork(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, kids...)
		// The parent after the fork and the child may each fill what is
		// left of 16 MB, no more (but the 64 KB an upper always has, and
		// the directories' own size).
		for who, s := range map[string]sandbox.Sandbox{"parent": cur, "child": kids[0]} {
			if kb := write(s, fmt.Sprintf("gen%d-%s", gen, who)); kb > 16<<10+128 {
				t.Errorf("generation %d: the %s's workdir holds %d KB, over its 16 MB disk", gen, who, kb)
			}
		}
		cur = kids[0]
	}
}

// A fork that copies the files on the host (its layers are maxLayers deep,
// or a file was open for writing) walks what the sandbox's commands made:
// a directory tree 12,000 deep held two descriptors a level open in this
// process (24,000: past its limit of open files, every other open of the
// process failing meanwhile). The copy holds a bounded number, and a tree
// deeper than it copies is refused as the sandbox's doing (ErrTooLarge,
// not infrastructure), the parent left as it was.
func TestAForkCopyOfADeepTreeHoldsFewDescriptors(t *testing.T) {
	b := need(t)
	defer containerd.SetMaxLayers(1)() // every fork copies
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, sandbox.Spec{Image: "python", Limits: sandbox.Limits{DiskMB: 64}})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the python image on containerd is required under CI=true: %v", err)
		}
		t.Skipf("the python image on containerd: %v", err)
	}
	defer sb.Close()
	deep := `cd /work && python3 -c '
import os
for _ in range(12000):
    os.mkdir("d"); os.chdir("d")
open("f", "w").write("bottom")
'`
	if r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: deep, Timeout: time.Minute}); err != nil || r.ExitCode != 0 {
		t.Fatalf("making the tree: %v %+v %s", err, r, r.Stderr)
	}
	peak := make(chan int)
	stop := make(chan struct{})
	go func() {
		most := 0
		for {
			select {
			case <-stop:
				peak <- most
				return
			default:
			}
			if fds, err := os.ReadDir("/proc/self/fd"); err == nil && len(fds) > most {
				most = len(fds)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	kids, err := sb.(sandbox.Forker).Fork(ctx, 1)
	close(stop)
	most := <-peak
	if err == nil {
		sandbox.CloseAll(kids)
	}
	if err != nil && (!errors.Is(err, sandbox.ErrTooLarge) || sandbox.IsInfra(err)) {
		t.Errorf("fork: %v, want a success or ErrTooLarge (the sandbox's doing)", err)
	}
	if most > 2000 {
		t.Errorf("the copy held %d descriptors open at once", most)
	}
	if r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "cd /work && python3 -c 'import os\nfor _ in range(12000): os.chdir(\"d\")\nprint(open(\"f\").read())'"}); err != nil || string(r.Stdout) != "bottom\n" {
		t.Errorf("the parent after the fork: %v %+v %s", err, r, r.Stderr)
	}
}

// A fork that copies the files on the host writes every byte of every
// file: a sparse file the sandbox's commands made (truncate -s 1G, which
// costs its disk nothing) or one file hard-linked many times (copied once
// per link) does not fit the layer sized to the disk limit. That is the
// sandbox's files (ErrTooLarge, a 409 for a trainer's fork), not an
// infrastructure failure: before, the copy's ENOSPC failed the fork as
// ErrSandboxFailed, and a group forked from it was dropped.
func TestAForkCopyOfASparseFileOverTheDiskIsTheSandboxsDoing(t *testing.T) {
	b := need(t)
	defer containerd.SetMaxLayers(1)() // every fork copies
	for name, cmd := range map[string]string{
		"sparse":     "truncate -s 1G /work/sparse",
		"hard links": "head -c 4m /dev/zero > /work/f && for i in 1 2 3 4 5 6; do ln /work/f /work/h$i; done",
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sb, err := b.Create(ctx, sandbox.Spec{Image: "base", Limits: sandbox.Limits{DiskMB: 16}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: cmd + " && echo made"}); err != nil || !strings.Contains(string(r.Stdout), "made") {
				t.Fatalf("making the files: %v %+v %s", err, r, r.Stderr)
			}
			start := time.Now()
			kids, err := sb.(sandbox.Forker).Fork(ctx, 1)
			t.Logf("fork after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if err == nil {
				sandbox.CloseAll(kids)
			}
			if err != nil && (!errors.Is(err, sandbox.ErrTooLarge) || sandbox.IsInfra(err)) {
				t.Errorf("fork: %v, want a success or ErrTooLarge (the sandbox's doing)", err)
			}
			if r, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "ls /work"}); err != nil || r.ExitCode != 0 {
				t.Errorf("the parent after the fork: %v %+v %s", err, r, r.Stderr)
			}
		})
	}
}

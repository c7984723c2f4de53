package docker_test

import (
	"context"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/docker"
)

// Benchmarks measure each path and its baseline in the same run, on the same
// engine, image and container:
//
//	go test ./sandbox/docker -run '^$' -bench . -benchtime 200x
//
// and report p50/p99 per operation in milliseconds besides the mean ns/op.

// latencies records one duration per operation.
type latencies []time.Duration

func (l latencies) report(b *testing.B) (p50 time.Duration) {
	if len(l) == 0 {
		return 0
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	pct := func(p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
	return pct(0.50)
}

func benchSandbox(b *testing.B, rt string) sandbox.Sandbox {
	be := need(b)
	sb, err := be.Create(context.Background(), sandbox.Spec{Image: "base", Runtime: rt})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close() })
	return sb
}

// BenchmarkExecTrue: one `true` in a running sandbox, through the guest agent
// and through the Docker exec API (ExecCreate, attach/start, ExecInspect) on
// the same container.
func BenchmarkExecTrue(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	sb := benchSandbox(b, sandbox.RuntimeRunc)
	var guestP50, execP50 time.Duration
	b.Run("guest", func(b *testing.B) {
		lat := make(latencies, 0, b.N)
		for b.Loop() {
			start := time.Now()
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("exec: %v exit %d", err, res.ExitCode)
			}
			lat = append(lat, time.Since(start))
		}
		guestP50 = lat.report(b)
	})
	b.Run("docker-exec-api", func(b *testing.B) {
		cli := be.Client()
		id := sb.Info().ID
		lat := make(latencies, 0, b.N)
		for b.Loop() {
			start := time.Now()
			ex, err := cli.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: []string{"true"}, AttachStdout: true, AttachStderr: true})
			if err != nil {
				b.Fatal(err)
			}
			hj, err := cli.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
			if err != nil {
				b.Fatal(err)
			}
			stdcopy.StdCopy(io.Discard, io.Discard, hj.Reader)
			hj.Close()
			in, err := cli.ContainerExecInspect(ctx, ex.ID)
			if err != nil || in.Running || in.ExitCode != 0 {
				b.Fatalf("exec inspect: %+v %v", in, err)
			}
			lat = append(lat, time.Since(start))
		}
		execP50 = lat.report(b)
	})
	if guestP50 > 0 && execP50 > 0 {
		b.Logf("p50: guest %v, docker exec API %v: %.0fx faster", guestP50, execP50, float64(execP50)/float64(guestP50))
	}
}

// BenchmarkExecTrueRunsc is the guest path under gVisor.
func BenchmarkExecTrueRunsc(b *testing.B) {
	ctx := context.Background()
	sb := benchSandbox(b, sandbox.RuntimeRunsc)
	lat := make(latencies, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	lat.report(b)
}

// BenchmarkReady: a sandbox created, started and answering its first exec,
// against `docker run --rm IMAGE true` through the API (create, attach,
// start, wait, remove) on the same image. Close is not timed.
func BenchmarkReady(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	for _, rt := range []string{sandbox.RuntimeRunc, sandbox.RuntimeRunsc} {
		b.Run("sandbox-"+rt, func(b *testing.B) {
			lat := make(latencies, 0, b.N)
			for b.Loop() {
				start := time.Now()
				sb, err := be.Create(ctx, sandbox.Spec{Image: "base", Runtime: rt})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				sb.Close()
				b.StartTimer()
			}
			lat.report(b)
		})
		b.Run("docker-run-"+rt, func(b *testing.B) {
			cli := be.Client()
			ref, _ := docker.ResolveImage("base")
			lat := make(latencies, 0, b.N)
			for b.Loop() {
				start := time.Now()
				c, err := cli.ContainerCreate(ctx, &container.Config{Image: ref, Cmd: []string{"true"}, AttachStdout: true, AttachStderr: true,
					Labels: map[string]string{docker.LabelOwner: testOwner}},
					&container.HostConfig{NetworkMode: "none", Runtime: rt}, nil, nil, "")
				if err != nil {
					b.Fatal(err)
				}
				hj, err := cli.ContainerAttach(ctx, c.ID, container.AttachOptions{Stream: true, Stdout: true, Stderr: true})
				if err != nil {
					b.Fatal(err)
				}
				waitC, errC := cli.ContainerWait(ctx, c.ID, container.WaitConditionNextExit)
				if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
					b.Fatal(err)
				}
				stdcopy.StdCopy(io.Discard, io.Discard, hj.Reader)
				hj.Close()
				select {
				case w := <-waitC:
					if w.StatusCode != 0 {
						b.Fatalf("exit %d", w.StatusCode)
					}
				case err := <-errC:
					b.Fatal(err)
				}
				if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			lat.report(b)
		})
	}
}

// BenchmarkPoolHit: a ready sandbox taken from a warm sandbox.Pool and
// answering one exec. The pool is refilled (untimed) before every Get.
func BenchmarkPoolHit(b *testing.B) {
	be := need(b)
	ctx := context.Background()
	spec := sandbox.Spec{Image: "base"}
	pool := sandbox.NewPool(be, 2)
	defer pool.Close()
	if err := pool.Warm(spec); err != nil {
		b.Fatal(err)
	}
	waitReady := func() {
		deadline := time.Now().Add(time.Minute)
		for pool.Stats().Ready[spec.Key()] < 2 {
			if time.Now().After(deadline) {
				b.Fatalf("pool did not refill: %+v", pool.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	lat := make(latencies, 0, b.N)
	b.StopTimer()
	waitReady()
	for i := 0; i < b.N; i++ {
		b.StartTimer()
		start := time.Now()
		sb, err := pool.Get(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		sb.Close()
		waitReady()
	}
	lat.report(b)
	if st := pool.Stats(); st.Misses > 0 {
		b.Errorf("pool missed %d times", st.Misses)
	}
}

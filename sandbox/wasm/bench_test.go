package wasm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/sandbox"
)

// reportLatencies adds p50 and p99 (microseconds) to a benchmark.
func reportLatencies(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), "p99-µs")
}

// BenchmarkExec measures one exec with a warm compilation cache, beside the
// native baseline of forking /bin/sh for the same command line.
//
//	go test -run '^$' -bench 'Exec' -benchtime 2s ./sandbox/wasm/
func BenchmarkExec(b *testing.B) {
	cases := []struct {
		name string
		req  sandbox.ExecRequest
		argv []string // the native equivalent
	}{
		{"sh-true", sandbox.ExecRequest{Shell: "true"}, []string{"/bin/sh", "-c", "true"}},
		{"sh-pipeline", sandbox.ExecRequest{Shell: "echo hi | wc -c"}, []string{"/bin/sh", "-c", "echo hi | wc -c"}},
		{"python-print", sandbox.ExecRequest{Argv: []string{"python", "-c", "print(1+1)"}}, []string{"python3", "-c", "print(1+1)"}},
		{"js-print", sandbox.ExecRequest{Argv: []string{"js", "-e", "console.log(1+1)"}}, nil},
	}
	if err := testBackend.Warm(context.Background(), "python", "js"); err != nil {
		b.Fatal(err)
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			sb, err := testBackend.Create(context.Background(), sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			defer sb.Close()
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				res, err := sb.Exec(context.Background(), c.req)
				lat = append(lat, time.Since(t0))
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("exec: %v exit %d %s", err, res.ExitCode, res.Stderr)
				}
			}
			reportLatencies(b, lat)
		})
		if c.argv == nil {
			continue
		}
		b.Run(c.name+"/native-fork", func(b *testing.B) {
			if _, err := exec.LookPath(c.argv[0]); err != nil {
				b.Skipf("%s: %v", c.argv[0], err)
			}
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := exec.Command(c.argv[0], c.argv[1:]...).Run(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			reportLatencies(b, lat)
		})
	}
}

// BenchmarkFirstExec measures the first-ever exec of a guest (compiling it
// with an empty compilation cache), then the first exec of a new process
// whose cache on disk is warm. The guests' Go build is not included (it is
// cached by images.Builder before the timer starts).
//
//	go test -run '^$' -bench 'FirstExec' -benchtime 1x ./sandbox/wasm/
func BenchmarkFirstExec(b *testing.B) {
	for _, guest := range []string{"python", "js"} {
		b.Run(guest, func(b *testing.B) {
			builder := images.NewBuilder(nil)
			if _, err := builder.Build(context.Background(), images.Target{Package: guests[guest], GOOS: "wasip1", GOARCH: "wasm", Name: guest + ".wasm"}); err != nil {
				b.Fatal(err)
			}
			req := sandbox.ExecRequest{Argv: []string{guest, "-c", "print(1)"}}
			if guest == "js" {
				req.Argv = []string{"js", "-e", "console.log(1)"}
			}
			firstExec := func(cacheDir string) time.Duration {
				be, err := New(context.Background(), Options{CacheDir: cacheDir, Builder: builder})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				sb, _ := be.Create(context.Background(), sandbox.Spec{})
				defer sb.Close()
				t0 := time.Now()
				res, err := sb.Exec(context.Background(), req)
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("exec: %v %s", err, res.Stderr)
				}
				return time.Since(t0)
			}
			var cold, warm time.Duration
			for b.Loop() {
				dir := b.TempDir()
				cold = firstExec(dir)
				warm = firstExec(dir) // a new runtime, as a second process would be
			}
			b.ReportMetric(float64(cold.Milliseconds()), "cold-ms")
			b.ReportMetric(float64(warm.Milliseconds()), "warm-start-ms")
		})
	}
}

func rssKB() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			n, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return n
		}
	}
	return 0
}

func settle() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return rssKB()
}

// BenchmarkDensity holds ROLLBOX_DENSITY live episodes, each with three small
// files, and runs one command at a time per episode across them (2×GOMAXPROCS
// in flight), against forking a native /bin/sh for the same command in a
// directory per episode.
//
//	ROLLBOX_DENSITY=10000 go test -run '^$' -bench Density -benchtime 1x -timeout 30m ./sandbox/wasm/
func BenchmarkDensity(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("ROLLBOX_DENSITY"))
	if n <= 0 {
		b.Skip("set ROLLBOX_DENSITY=N to hold N episodes")
	}
	const line = "cat notes.txt | grep -c line"
	files := map[string][]byte{
		"/work/notes.txt": bytes.Repeat([]byte("a line of notes\n"), 20),
		"/work/main.py":   []byte("print('hello')\n"),
		"/work/data.json": []byte(`{"k": [1, 2, 3]}`),
	}
	var fileBytes int64
	for _, d := range files {
		fileBytes += int64(len(d))
	}
	for b.Loop() {
		ctx := context.Background()
		before := settle()
		sbs := make([]sandbox.Sandbox, n)
		for i := range sbs {
			sb, err := testBackend.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			for p, d := range files {
				if err := sb.WriteFile(ctx, p, d, 0o644); err != nil {
					b.Fatal(err)
				}
			}
			sbs[i] = sb
		}
		after := settle()
		perEpisode := float64(after-before) * 1024 / float64(n)
		b.ReportMetric(perEpisode/1024, "rss-KB/episode")
		b.ReportMetric(float64(fileBytes)/1024, "files-KB/episode")

		workers := 2 * runtime.GOMAXPROCS(0)
		run := func(dur time.Duration, do func(i int) error) float64 {
			var next, done atomic.Int64
			deadline := time.Now().Add(dur)
			var wg sync.WaitGroup
			var firstErr atomic.Value
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(deadline) {
						i := int(next.Add(1)-1) % n // episode i has one command in flight at most
						if err := do(i); err != nil {
							firstErr.CompareAndSwap(nil, err)
							return
						}
						done.Add(1)
					}
				}()
			}
			start := time.Now()
			wg.Wait()
			if err, _ := firstErr.Load().(error); err != nil {
				b.Fatal(err)
			}
			return float64(done.Load()) / time.Since(start).Seconds()
		}
		rate := run(5*time.Second, func(i int) error {
			res, err := sbs[i].Exec(ctx, sandbox.ExecRequest{Shell: line})
			if err == nil && string(res.Stdout) != "20\n" {
				err = fmt.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
			return err
		})
		b.ReportMetric(rate, "execs/s")
		pyRate := run(5*time.Second, func(i int) error {
			_, err := sbs[i].Exec(ctx, sandbox.ExecRequest{Shell: "python main.py"})
			return err
		})
		b.ReportMetric(pyRate, "python-execs/s")

		// The native floor: the same files in a directory per episode,
		// /bin/sh forked per command.
		root := b.TempDir()
		dirs := make([]string, n)
		for i := range dirs {
			dirs[i] = filepath.Join(root, strconv.Itoa(i))
			os.MkdirAll(dirs[i], 0o755)
			for p, d := range files {
				os.WriteFile(filepath.Join(dirs[i], filepath.Base(p)), d, 0o644)
			}
		}
		native := run(5*time.Second, func(i int) error {
			cmd := exec.Command("/bin/sh", "-c", line)
			cmd.Dir = dirs[i]
			out, err := cmd.Output()
			if err == nil && string(out) != "20\n" {
				err = fmt.Errorf("native stdout %q", out)
			}
			return err
		})
		b.ReportMetric(native, "native-sh-execs/s")
		idle := settle()
		b.ReportMetric(float64(idle-before)/float64(n), "rss-KB/episode-after-execs")
		// The helpers are a fixed cost, not an episode's: at most
		// MaxShells of them, whatever the number of episodes.
		helpers, kb := testBackend.helperRSS()
		b.ReportMetric(float64(helpers), "helpers")
		b.ReportMetric(float64(kb)/1024, "helpers-rss-MB")
		for _, sb := range sbs {
			sb.Close()
		}
	}
}

package auditlog

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// appendPerLine is Append as it was before group commit (the benchmark's
// baseline): the whole append, its fsync included, under one mutex.
func (l *Log) appendPerLine(mu *sync.Mutex, r Record) error {
	mu.Lock()
	defer mu.Unlock()
	if err := l.lock(); err != nil {
		return err
	}
	defer func() { l.unlock() }() // l.f may change
	if l.opts.MaxBytes > 0 {
		if err := l.followRotationLocked(); err != nil {
			return err
		}
	}
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	if st.Size() != l.end { // another writer appended: chain to its last line
		if err := l.readTail(); err != nil {
			return err
		}
	}
	if l.opts.MaxBytes > 0 && st.Size() >= l.opts.MaxBytes {
		if err := l.rotateLocked(st.Size()); err != nil {
			return err
		}
		if st, err = l.f.Stat(); err != nil {
			return fmt.Errorf("audit log %s: %w", l.path, err)
		}
	}
	r.V, r.Seq, r.Prev = Version, l.seq+1, l.prev
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	line, hash, err := encodeLine(r)
	if err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	if _, err := l.f.Write(line); err != nil {
		return fmt.Errorf("audit log %s: %w", l.path, err)
	}
	if l.opts.Sync == SyncEvery {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("audit log %s: fsync: %w", l.path, err)
		}
		l.syncs.Add(1)
	}
	l.prev, l.seq, l.end = hash, r.Seq, st.Size()+int64(len(line))
	return nil
}

// BenchmarkConcurrentAppends: N goroutines append to one log (SyncEvery,
// as serve's), the previous per-line fsync under a mutex beside group
// commit, for each N in the same run. ns/op is per line.
func BenchmarkConcurrentAppends(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		for _, impl := range []string{"per-line", "group"} {
			b.Run(fmt.Sprintf("appenders=%d/%s", n, impl), func(b *testing.B) {
				l, err := Open(filepath.Join(b.TempDir(), "audit.jsonl"), Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				var mu sync.Mutex
				app := l.Append
				if impl == "per-line" {
					app = func(r Record) error { return l.appendPerLine(&mu, r) }
				}
				b.ResetTimer()
				var wg sync.WaitGroup
				for w := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := w; i < b.N; i += n {
							code := 0
							if err := app(Record{Op: OpExec, Episode: "ep", Sandbox: "sb", Argv: []string{"bash", "-c", "true"}, ExitCode: &code, DurationMS: 1.5}); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				syncs := l.syncs.Load()
				b.ReportMetric(float64(syncs)/float64(b.N), "fsyncs/line")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
			})
		}
	}
}

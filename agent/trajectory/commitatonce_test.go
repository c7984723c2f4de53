package trajectory

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// commitAtOnce has n goroutines each commit a small document to dir with
// commit, so that all but the first arrive while the first's group commit
// runs: hold installs a hook the commit calls before its disk work (nil
// removes it), and arrived says how many now wait for the next one, which
// is waited for until it is want. Each document is read back once its
// commit returns; the errors are each document's.
func commitAtOnce(t *testing.T, dir string, n, want int, hold func(func()), arrived func() int, commit func(path string, doc []byte) error) []error {
	t.Helper()
	first, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold(func() { once.Do(func() { close(first); <-held }) })
	defer hold(nil)
	var wg sync.WaitGroup
	errs := make([]error, n)
	run := func(i int) {
		defer wg.Done()
		path := filepath.Join(dir, fmt.Sprintf("e%d.json", i))
		doc := fmt.Sprintf(`{"episode_id": "e%d"}`, i)
		if errs[i] = commit(path, []byte(doc)); errs[i] != nil {
			return
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != doc+"\n" {
			errs[i] = fmt.Errorf("read back: %v %q", err, b)
		}
	}
	wg.Add(1)
	go run(0)
	<-first
	for i := 1; i < n; i++ {
		wg.Add(1)
		go run(i)
	}
	for deadline := time.Now().Add(10 * time.Second); arrived() != want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(held)
	wg.Wait()
	return errs
}

package runtime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// claimLog keeps a coordinator's claims (claimRecord, by episode) in one
// append-only file, DATA/cluster/claims.log, a line per change: "ID\tJSON"
// (the claim now) or "ID\t-" (dropped: the episode's record decides). One
// write of a line replaces what were a file created, rewritten and
// removed per episode. Lines are single writes to a file opened for
// appending, so a killed process never leaves half a line; a torn last
// line (the machine stopped) whose ID is whole marks that episode's claim
// asked, to be safe (no silent re-run of a sampled episode). The live
// claims are held in memory too; the file is rewritten with only them at
// open and whenever it has grown past four times their number (and 10,000
// lines).
type claimLog struct {
	path string

	mu    sync.Mutex
	f     *os.File
	m     map[string]claimRecord
	lines int
}

// openClaimLog reads dir/claims.log (and the claim files dir/claims/*.json
// of an earlier version, removed once carried over), rewrites the log with
// the live claims and opens it for appending.
func openClaimLog(dir string) (*claimLog, error) {
	l := &claimLog{path: filepath.Join(dir, "claims.log"), m: map[string]claimRecord{}}
	legacy, _ := filepath.Glob(filepath.Join(dir, "claims", "*.json"))
	for _, p := range legacy {
		var cl claimRecord
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if json.Unmarshal(b, &cl) != nil {
			cl.Asked = true // torn as the process died
		}
		l.m[strings.TrimSuffix(filepath.Base(p), ".json")] = cl
	}
	if b, err := os.ReadFile(l.path); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			id, rest, whole := strings.Cut(sc.Text(), "\t")
			if id == "" || !whole {
				continue // torn before its ID was whole: nothing to tell
			}
			if rest == "-" {
				delete(l.m, id)
				continue
			}
			var cl claimRecord
			if json.Unmarshal([]byte(rest), &cl) != nil {
				cl = l.m[id]
				cl.Asked = true
			}
			l.m[id] = cl
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cluster claims: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.rewriteLocked(); err != nil {
		return nil, err
	}
	for _, p := range legacy {
		os.Remove(p)
	}
	os.Remove(filepath.Join(dir, "claims"))
	return l, nil
}

// rewriteLocked writes the live claims to a new log, renames it into place
// and appends to it from then on.
func (l *claimLog) rewriteLocked() error {
	var buf bytes.Buffer
	for id, cl := range l.m {
		b, _ := json.Marshal(cl)
		buf.WriteString(id)
		buf.WriteByte('\t')
		buf.Write(b)
		buf.WriteByte('\n')
	}
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("cluster claims: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cluster claims: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("cluster claims: %w", err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.lines = f, len(l.m)
	return nil
}

// appendLocked writes one line and rewrites the log when it has grown
// past four times the live claims.
func (l *claimLog) appendLocked(id, body string) error {
	if l.f == nil {
		return errors.New("cluster claims: the log is closed")
	}
	if _, err := l.f.WriteString(id + "\t" + body + "\n"); err != nil {
		return err
	}
	if l.lines++; l.lines > 10000 && l.lines > 4*len(l.m) {
		return l.rewriteLocked()
	}
	return nil
}

// save records an episode's claim.
func (l *claimLog) save(id string, cl claimRecord) error {
	b, _ := json.Marshal(cl)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[id] = cl
	return l.appendLocked(id, string(b))
}

// get is an episode's claim, if it has one.
func (l *claimLog) get(id string) (claimRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cl, ok := l.m[id]
	return cl, ok
}

// drop forgets an episode's claim.
func (l *claimLog) drop(id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[id]; !ok {
		return nil
	}
	delete(l.m, id)
	return l.appendLocked(id, "-")
}

func (l *claimLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

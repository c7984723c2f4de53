package judge

import (
	"container/list"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// Entry is a judge's answer as cached: its raw text (parsed again on
// every hit, on the rubric's scale), the model that wrote it, its cost.
type Entry struct {
	Text      string            `json:"text"`
	Model     string            `json:"model,omitempty"`
	Usage     *trajectory.Usage `json:"usage,omitempty"`
	LatencyMS float64           `json:"latency_ms"`

	wait time.Duration // waited for a slot (not cached)
}

// Cache keeps judge answers by Key. Only answers that parsed are put.
type Cache interface {
	Get(key string) (Entry, bool)
	Put(key string, e Entry)
}

// MemoryCache is an in-memory LRU cache. Safe for concurrent use.
type MemoryCache struct {
	mu    sync.Mutex
	max   int
	ll    *list.List
	items map[string]*list.Element
}

type memItem struct {
	key string
	e   Entry
}

// NewMemoryCache keeps up to max entries (the least recently used go).
func NewMemoryCache(max int) *MemoryCache {
	return &MemoryCache{max: max, ll: list.New(), items: map[string]*list.Element{}}
}

// Get implements Cache.
func (c *MemoryCache) Get(key string) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return Entry{}, false
	}
	c.ll.MoveToFront(el)
	return el.Value.(*memItem).e, true
}

// Put implements Cache.
func (c *MemoryCache) Put(key string, e Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.wait = 0
	if el, ok := c.items[key]; ok {
		el.Value.(*memItem).e = e
		c.ll.MoveToFront(el)
		return
	}
	c.items[key] = c.ll.PushFront(&memItem{key, e})
	for c.max > 0 && c.ll.Len() > c.max {
		last := c.ll.Back()
		c.ll.Remove(last)
		delete(c.items, last.Value.(*memItem).key)
	}
}

// Len is the number of entries.
func (c *MemoryCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

// DirCache keeps entries as files under Dir (<key[:2]>/<key>.json), so a
// later process (a replay, a rescore) finds them. Writes are atomic; a
// file that cannot be read is a miss.
type DirCache struct {
	Dir string
}

func (c DirCache) path(key string) string {
	if len(key) < 3 {
		return filepath.Join(c.Dir, "_", key+".json")
	}
	return filepath.Join(c.Dir, key[:2], key+".json")
}

// Get implements Cache.
func (c DirCache) Get(key string) (Entry, bool) {
	b, err := os.ReadFile(c.path(key))
	if err != nil {
		return Entry{}, false
	}
	var e Entry
	if json.Unmarshal(b, &e) != nil {
		return Entry{}, false
	}
	return e, true
}

// Put implements Cache. A failure to write is ignored: the cache is an
// optimisation.
func (c DirCache) Put(key string, e Entry) {
	p := c.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), p) != nil {
		os.Remove(f.Name())
	}
}

// Tiered looks in each cache in turn and puts into all; a hit in a later
// one is copied into the earlier ones.
func Tiered(caches ...Cache) Cache { return tiered(caches) }

type tiered []Cache

func (t tiered) Get(key string) (Entry, bool) {
	for i, c := range t {
		if e, ok := c.Get(key); ok {
			for _, up := range t[:i] {
				up.Put(key, e)
			}
			return e, true
		}
	}
	return Entry{}, false
}

func (t tiered) Put(key string, e Entry) {
	for _, c := range t {
		c.Put(key, e)
	}
}

// Seed puts the answers a recorded judge reward holds into c (the
// samples that scored), so judging the same episode again with the same
// judges and rubrics asks nothing.
func Seed(c Cache, j *trajectory.Judge) int {
	if j == nil {
		return 0
	}
	n := 0
	for _, js := range j.Judges {
		for _, rs := range js.Rubrics {
			for _, s := range rs.Samples {
				if s.Score == nil || s.Key == "" || s.Text == "" {
					continue
				}
				c.Put(s.Key, Entry{Text: s.Text, Model: s.Model, Usage: s.Usage, LatencyMS: s.LatencyMS})
				n++
			}
		}
	}
	return n
}

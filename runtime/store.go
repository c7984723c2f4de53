package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// The store keeps what survives a restart under the data directory:
//
//	DIR/rollbox.db               bbolt: rollouts and episodes, indexed
//	DIR/episodes/<id>.json       one trajectory each, journalled step by step
//	                             (<id>.json.partial while the episode runs)
//	DIR/attempts/<id>.<n>.json   records of attempts retried after an
//	                             infrastructure failure (never streamed)
//
// The trajectory files are the record; the database is the index over them
// (which rollout, which group, what state, how it ended, in what order).
type store struct {
	dir         string
	episodesDir string
	attemptsDir string
	db          *bolt.DB
}

var (
	bucketRollouts = []byte("rollouts")
	bucketEpisodes = []byte("episodes")
)

// Episode record states. An episode is "queued" from admission until it
// ends; the running ones are known from memory (and, after a crash, from
// their journals).
const (
	episodeQueued = "queued"
	episodeDone   = "done"
)

// rolloutRecord is a rollout as indexed.
type rolloutRecord struct {
	ID            string            `json:"id"`
	State         string            `json:"state"`
	CreatedAt     time.Time         `json:"created_at"`
	EndedAt       *time.Time        `json:"ended_at,omitempty"`
	GroupSize     int               `json:"group_size"`
	EpisodesTotal int               `json:"episodes_total"`
	Backend       string            `json:"backend"`
	Policy        trajectory.Policy `json:"policy"`
	// Tasks are the tasks as run (defaults applied), so episodes that never
	// started can still be recorded after a crash.
	Tasks        []json.RawMessage `json:"tasks"`
	InfraRetries int               `json:"infra_retries"`
	Message      string            `json:"message,omitempty"`
	// Tenant owns the rollout ("" without --auth-tokens): nobody else sees it.
	Tenant string `json:"tenant,omitempty"`
	// Schedule is "groups" or "episodes" (see RolloutRequest.Schedule).
	Schedule string `json:"schedule,omitempty"`
	// Cluster is set on a coordinator's rollout: what dispatches its
	// episodes again after a restart.
	Cluster *clusterRollout `json:"cluster,omitempty"`
}

// episodeRecord is an episode as indexed. Env-mode episodes have no rollout.
type episodeRecord struct {
	ID         string         `json:"id"`
	Mode       string         `json:"mode"` // rollout, env or import
	RolloutID  string         `json:"rollout_id,omitempty"`
	GroupID    string         `json:"group_id,omitempty"`
	GroupIndex int            `json:"group_index"`
	TaskIndex  int            `json:"task_index"`
	TaskID     string         `json:"task_id"`
	State      string         `json:"state"`
	Reason     string         `json:"reason,omitempty"`
	Reward     *float64       `json:"reward,omitempty"`
	ToolErrors map[string]int `json:"tool_errors,omitempty"`
	Seq        int            `json:"seq,omitempty"` // finish order within the rollout, from 1
	EndedAt    *time.Time     `json:"ended_at,omitempty"`
	// Message says why an episode without a readable record has none
	// (record_error: the disk was full).
	Message string `json:"message,omitempty"`
	// Tenant owns an environment-mode episode ("" without --auth-tokens).
	Tenant string `json:"tenant,omitempty"`
	// Monitors are the monitors the episode triggered (group statistics).
	Monitors []string `json:"monitors,omitempty"`
	// Imported episodes (Mode "import"): their source, the deployment's
	// policy version, the caller's id, when they were imported, when their
	// outcome window closes, and their outcome status (pending, scored).
	Source        string     `json:"source,omitempty"`
	PolicyVersion string     `json:"policy_version,omitempty"`
	ExternalID    string     `json:"external_id,omitempty"`
	ImportedAt    *time.Time `json:"imported_at,omitempty"`
	MaturesAt     *time.Time `json:"matures_at,omitempty"`
	Outcome       string     `json:"outcome,omitempty"`
	// Truncated counts the steps whose output the model did not see whole.
	Truncated *trajectory.Truncations `json:"truncated,omitempty"`
}

func openStore(dir string) (*store, error) {
	st := &store{dir: dir, episodesDir: filepath.Join(dir, "episodes"), attemptsDir: filepath.Join(dir, "attempts")}
	for _, d := range []string{st.episodesDir, st.attemptsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		}
	}
	db, err := bolt.Open(filepath.Join(dir, "rollbox.db"), 0o644, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("data directory %s is in use by another rollbox serve", dir)
		}
		return nil, fmt.Errorf("open %s: %w", filepath.Join(dir, "rollbox.db"), err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRollouts, bucketEpisodes, bucketGroups, bucketMaturing} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	st.db = db
	return st, nil
}

func (st *store) Close() error { return st.db.Close() }

// trajectoryPath is where an episode's record is.
func (st *store) trajectoryPath(id string) string { return filepath.Join(st.episodesDir, id+".json") }

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

// createRollout indexes a new rollout and all its episodes, queued, in one
// transaction.
func (st *store) createRollout(r *rolloutRecord, eps []*episodeRecord) error {
	return st.db.Update(func(tx *bolt.Tx) error {
		if err := put(tx, bucketRollouts, r.ID, r); err != nil {
			return err
		}
		for _, e := range eps {
			if err := put(tx, bucketEpisodes, e.ID, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// putEnds indexes many episodes' changes and rollouts in one transaction
// (one fsync): a recovery, a cancellation or a shutdown ends thousands of
// episodes at once.
func (st *store) putEnds(eps []*episodeRecord, rollouts ...*rolloutRecord) error {
	return st.db.Update(func(tx *bolt.Tx) error {
		for _, e := range eps {
			if err := put(tx, bucketEpisodes, e.ID, e); err != nil {
				return err
			}
		}
		for _, r := range rollouts {
			if err := put(tx, bucketRollouts, r.ID, r); err != nil {
				return err
			}
		}
		return nil
	})
}

func (st *store) putRollout(r *rolloutRecord) error {
	return st.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketRollouts, r.ID, r) })
}

// putEpisode indexes an episode's change. Concurrent callers are coalesced
// into one transaction (bbolt's Batch), so thousands of episodes ending at
// once cost a few fsyncs.
func (st *store) putEpisode(e *episodeRecord) error {
	return st.db.Batch(func(tx *bolt.Tx) error { return put(tx, bucketEpisodes, e.ID, e) })
}

func (st *store) rollout(id string) (*rolloutRecord, error) {
	var r *rolloutRecord
	err := st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRollouts).Get([]byte(id))
		if b == nil {
			return nil
		}
		r = &rolloutRecord{}
		return json.Unmarshal(b, r)
	})
	return r, err
}

// rollouts lists every rollout record, oldest id first.
func (st *store) rollouts() ([]*rolloutRecord, error) {
	var out []*rolloutRecord
	err := st.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRollouts).ForEach(func(_, v []byte) error {
			r := &rolloutRecord{}
			if err := json.Unmarshal(v, r); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func (st *store) episode(id string) (*episodeRecord, error) {
	var e *episodeRecord
	err := st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEpisodes).Get([]byte(id))
		if b == nil {
			return nil
		}
		e = &episodeRecord{}
		return json.Unmarshal(b, e)
	})
	return e, err
}

// rolloutEpisodes returns a rollout's episodes: their ids start with the
// rollout id and a dot.
func (st *store) rolloutEpisodes(rolloutID string) ([]*episodeRecord, error) {
	var out []*episodeRecord
	prefix := []byte(rolloutID + ".")
	err := st.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEpisodes).Cursor()
		for k, v := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, v = c.Next() {
			e := &episodeRecord{}
			if err := json.Unmarshal(v, e); err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// openEnvEpisodes returns env-mode episodes that had not ended.
func (st *store) openEnvEpisodes() ([]*episodeRecord, error) {
	var out []*episodeRecord
	err := st.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEpisodes).Cursor()
		prefix := []byte(envPrefix)
		for k, v := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), envPrefix); k, v = c.Next() {
			e := &episodeRecord{}
			if err := json.Unmarshal(v, e); err != nil {
				return err
			}
			if e.State != episodeDone {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, err
}

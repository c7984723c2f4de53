package runtime

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/rollbox/rollbox/agent/monitor"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// modeImport is the index mode of imported episodes.
const modeImport = "import"

// codeNotImported: outcome signals sent to an episode that was not imported.
const codeNotImported = "not_imported"

// bucketGroups counts imported episodes per group (the next group index).
var bucketGroups = []byte("import_groups")

// Import answer bounds: the lists stop there (the counts go on).
const (
	maxRejectedListed = 1000
	maxEpisodesListed = 10000
)

// ImportResult is the answer to POST /v1/imports.
type ImportResult struct {
	// Accepted episodes are stored (durably) by this request; Duplicates
	// were stored before (the same id from the same tenant and source) and
	// are left as they were.
	Accepted   int `json:"accepted"`
	Duplicates int `json:"duplicates"`
	// Rejected lists refused lines with the field and why (the first
	// maxRejectedListed; RejectedCount counts them all).
	Rejected      []lineError `json:"rejected"`
	RejectedCount int         `json:"rejected_count"`
	// Episodes are the ids given, line by line (the first
	// maxEpisodesListed; EpisodesOmitted counts the rest).
	Episodes        []ImportedRef `json:"episodes"`
	EpisodesOmitted int           `json:"episodes_omitted,omitempty"`
	Lines           int           `json:"lines"`
	Bytes           int64         `json:"bytes"`
	Source          string        `json:"source"`
}

// ImportedRef names an imported line's episode.
type ImportedRef struct {
	Line       int    `json:"line"`
	ID         string `json:"id"`
	ExternalID string `json:"external_id"`
	Duplicate  bool   `json:"duplicate,omitempty"`
}

// importChunk bounds what is parsed before it is stored: a chunk is made
// durable (one file-system sync, one transaction) before the next is read,
// so memory stays bounded whatever the size of the body.
const (
	importChunkEpisodes = 1024
	importChunkBytes    = 16 << 20
)

// postImport stores the episodes of an NDJSON body (OpenAI chat-completions
// episodes or Rollbox trajectories, one a line), streaming: the body is
// read a line at a time, never whole; each chunk of lines is made durable
// before the next is read, and everything is durable before the answer.
// A bad line is refused with its line number and field; the others are
// kept. An id already imported (by this tenant, from this source) is a
// duplicate: nothing is stored twice, so a sender may resend a whole file
// after a failure.
func (s *Server) postImport(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	o := &importOptions{source: trajectory.SourceProduction, policyVersion: q.Get("policy_version"), groupBy: q.Get("group_by"),
		tenant: tenantOf(r), spec: s.outcomeSpec, specJSON: s.outcomeSpecJSON}
	if v := q.Get("source"); v != "" {
		if !sourceRe.MatchString(v) || v == trajectory.SourceRollout || v == trajectory.SourceEnv {
			return badField("source", "%q: use lower-case letters, digits, _ . - (at most 64), not rollout or env", v)
		}
		o.source = v
	}
	switch o.groupBy {
	case "", GroupByGroupID, GroupByTaskID, GroupByPrompt:
	default:
		return badField("group_by", "%q is not one of group_id, task_id, prompt", o.groupBy)
	}
	if err := s.refuseImport(); err != nil {
		return err
	}
	select {
	case s.importSlots <- struct{}{}:
		defer func() { <-s.importSlots }()
		s.worked.Store(true)
	default:
		s.metrics.ImportsRefused.Inc()
		return &apiError{Status: http.StatusTooManyRequests, Code: codeOverloaded, RetryAfter: 2,
			Message: fmt.Sprintf("%d imports are running, the most at once (--max-imports); retry after a moment (resending is safe: what was stored counts as duplicates)", cap(s.importSlots))}
	}
	res := &ImportResult{Rejected: []lineError{}, Episodes: []ImportedRef{}, Source: o.source}
	rc := http.NewResponseController(w)
	// The answer's write deadline starts when the body has been read (an
	// import of a large file takes longer than --write-timeout to read).
	renewWrite := func() { rc.SetWriteDeadline(time.Now().Add(s.opts.HTTP.Write)) }
	defer renewWrite() // for an error answer
	body := &deadlineReader{r: http.MaxBytesReader(w, r.Body, 1<<62), rc: rc, d: s.opts.HTTP.Read}
	br := bufio.NewReaderSize(body, 256<<10)
	// Parsing and storing overlap: this goroutine parses the next chunk
	// while the storer makes the previous one durable (at most two chunks
	// held besides the one being read). The storer alone sets Accepted,
	// Duplicates and Episodes; this goroutine the rest.
	chunks := make(chan []*importedEpisode)
	stored := make(chan error, 1)
	var storeFailed atomic.Bool
	go func() {
		var err error
		for c := range chunks {
			if err == nil {
				if err = s.storeImported(c, o, res); err != nil {
					storeFailed.Store(true)
				}
			}
		}
		stored <- err
	}()
	var chunk []*importedEpisode
	chunkBytes := 0
	finished := false
	var storeErr error
	finish := func() error {
		if !finished {
			finished = true
			close(chunks)
			storeErr = <-stored
		}
		return storeErr
	}
	defer finish()
	flush := func() error {
		if len(chunk) > 0 {
			chunks <- chunk
			chunk, chunkBytes = nil, 0
		}
		if storeFailed.Load() {
			return finish()
		}
		return nil
	}
	var line []byte
	for n := 1; ; n++ {
		var over bool
		var err error
		line, over, err = readLine(br, line[:0], s.limits.MaxImportEpisodeBytes)
		if len(line) == 0 && !over && err != nil {
			if err == io.EOF {
				break
			}
			flush()
			return s.importFailed(finish(), err, res, n)
		}
		res.Lines = n
		res.Bytes = body.n
		switch {
		case over:
			res.reject(lineError{Line: n, Message: fmt.Sprintf("the episode is over %d bytes (--import-max-episode-bytes); it was skipped", s.limits.MaxImportEpisodeBytes)})
		case len(bytes.TrimSpace(line)) == 0:
		default:
			o.now = s.now().UTC()
			ep, le := s.parseImportLine(line, o)
			if le != nil {
				le.Line = n
				res.reject(*le)
				break
			}
			ep.line, ep.importedAt = n, o.now
			chunk = append(chunk, ep)
			chunkBytes += len(line)
		}
		if len(chunk) >= importChunkEpisodes || chunkBytes >= importChunkBytes {
			if err := flush(); err != nil {
				return s.importFailed(nil, err, res, n)
			}
			if s.closingFlag.Load() {
				return s.importFailed(finish(), errors.New("the service is stopping"), res, n)
			}
		}
		if err != nil { // a last line without a newline
			if err == io.EOF {
				break
			}
			flush()
			return s.importFailed(finish(), err, res, n)
		}
	}
	flush()
	if err := finish(); err != nil {
		return s.importFailed(nil, err, res, res.Lines)
	}
	res.Bytes = body.n
	s.metrics.ImportedBytes.Add(float64(res.Bytes))
	renewWrite()
	writeHTTPJSON(w, http.StatusOK, res)
	return nil
}

func (res *ImportResult) reject(le lineError) {
	res.RejectedCount++
	if len(res.Rejected) < maxRejectedListed {
		res.Rejected = append(res.Rejected, le)
	}
}

// importFailed is the error of an import stopped before its end: what was
// stored so far stays stored (and is said so), the rest was not read.
func (s *Server) importFailed(flushErr, err error, res *ImportResult, line int) error {
	if flushErr != nil {
		err = flushErr
	}
	var ae *apiError
	var mbe *http.MaxBytesError
	stored := fmt.Sprintf("%d episode(s) were stored before it stopped, at line %d (resending the file is safe: they count as duplicates)", res.Accepted, line)
	switch {
	case errors.As(err, &ae):
		ae.Message += "; " + stored
		return ae
	case errors.As(err, &mbe):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: codeTooLarge, Message: "the body is too large; " + stored}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &apiError{Status: http.StatusRequestTimeout, Code: codeTimeout, Message: "the body stopped arriving; " + stored}
	case s.closingFlag.Load():
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeShuttingDown, RetryAfter: 5, Message: "the service is stopping; " + stored}
	}
	return fmt.Errorf("import: %w; %s", err, stored)
}

// refuseImport is the error an import gets when it cannot be taken now.
func (s *Server) refuseImport() error {
	if s.closingFlag.Load() {
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeShuttingDown, RetryAfter: 5, Message: "the service is stopping"}
	}
	return s.storage.refusal()
}

// readLine reads the next line into buf (without its newline or a CR
// before it). A line longer than limit is skipped to its end without being
// kept (over). err is io.EOF after a last line without a newline, or at the
// end.
func readLine(br *bufio.Reader, buf []byte, limit int) (line []byte, over bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		if !over {
			if len(buf)+len(frag) > limit+2 {
				over, buf = true, buf[:0]
			} else {
				buf = append(buf, frag...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if over {
			return nil, true, err
		}
		buf = bytes.TrimSuffix(buf, []byte("\n"))
		buf = bytes.TrimSuffix(buf, []byte("\r"))
		if len(buf) > limit {
			return nil, true, err
		}
		return buf, false, err
	}
}

// deadlineReader renews the request's read deadline before every read, so
// a long import lives while its sender sends, and one that stops sending
// is cut off (Options.HTTP.Read). It counts the bytes read.
type deadlineReader struct {
	r  io.Reader
	rc *http.ResponseController
	d  time.Duration
	n  int64
}

func (dr *deadlineReader) Read(p []byte) (int, error) {
	dr.rc.SetReadDeadline(time.Now().Add(dr.d))
	n, err := dr.r.Read(p)
	dr.n += int64(n)
	return n, err
}

// storeImported makes a chunk of parsed episodes durable: the ones not
// already imported get their group index and record, written together
// (one file-system sync), then indexed in one transaction with their
// groups' counts and their windows. Imports are stored one chunk at a
// time (importMu), so two imports of the same id never both store it.
// Only then are they counted accepted: an answer never names an episode a
// crash could lose.
func (s *Server) storeImported(chunk []*importedEpisode, o *importOptions, res *ImportResult) error {
	s.importMu.Lock()
	defer s.importMu.Unlock()
	for _, ep := range chunk {
		ep.id = importedID(o.tenant, o.source, ep.externalID)
	}
	var fresh []*importedEpisode
	var refs []ImportedRef
	defer func() {
		sort.Slice(refs, func(i, j int) bool { return refs[i].Line < refs[j].Line })
		for _, r := range refs {
			res.episode(r)
		}
	}()
	counts := map[string]int{}
	err := s.st.db.View(func(tx *bolt.Tx) error {
		eps, groups := tx.Bucket(bucketEpisodes), tx.Bucket(bucketGroups)
		seen := map[string]bool{}
		for _, ep := range chunk {
			if seen[ep.id] || eps.Get([]byte(ep.id)) != nil {
				refs = append(refs, ImportedRef{Line: ep.line, ID: ep.id, ExternalID: ep.externalID, Duplicate: true})
				res.Duplicates++
				continue
			}
			seen[ep.id] = true
			t := ep.t
			t.GroupID = importedGroupID(o.tenant, o.source, t.Import.GroupBy, t.Import.GroupKey)
			if _, ok := counts[t.GroupID]; !ok {
				if v := groups.Get([]byte(t.GroupID)); v != nil {
					counts[t.GroupID], _ = strconv.Atoi(string(v))
				}
			}
			fresh = append(fresh, ep)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(fresh) == 0 {
		return nil
	}
	ts := make([]*trajectory.Trajectory, len(fresh))
	recs := make([]*episodeRecord, len(fresh))
	for i, ep := range fresh {
		t := ep.t
		t.EpisodeID, t.RolloutID, t.Source = ep.id, "", o.source
		t.GroupIndex = counts[t.GroupID]
		counts[t.GroupID]++
		t.Seed = int64(t.GroupIndex)
		t.Import.ImportedAt = ep.importedAt
		if t.Outcomes.Spec == nil {
			t.Outcomes.Spec = s.outcomeSpecJSON
		}
		t.Outcomes.MaturesAt = t.Import.ImportedAt.Add(ep.spec.window())
		addSignals(t.Outcomes, ep.signals)
		t.Reward = pendingReward(t.Outcomes.MaturesAt)
		if _, err := matureIfDue(t, s.now()); err != nil {
			return err
		}
		if t.Stats.ToolErrors == nil || t.Import.Format == FormatOpenAI {
			t.Stats = trajectory.StatsOf(t)
		}
		// The same monitors as an episode run here, from the record: an
		// imported trajectory's own are the sender's word, not a reading.
		t.Monitors = monitor.Compute(t, nil)
		ended := t.Import.ImportedAt
		if t.EndedAt != nil {
			ended = *t.EndedAt
		}
		imported, matures := t.Import.ImportedAt, t.Outcomes.MaturesAt
		recs[i] = &episodeRecord{ID: ep.id, Mode: modeImport, GroupID: t.GroupID, GroupIndex: t.GroupIndex, TaskID: t.TaskID,
			State: episodeDone, Reason: t.Termination.Reason, EndedAt: &ended, Tenant: o.tenant, Source: o.source,
			PolicyVersion: t.Import.PolicyVersion, ExternalID: ep.externalID, ImportedAt: &imported, MaturesAt: &matures}
		setImportOutcome(recs[i], t)
		if len(t.Stats.ToolErrors) > 0 {
			recs[i].ToolErrors = t.Stats.ToolErrors
		}
		recs[i].Monitors = t.Monitors.Triggered()
		ts[i] = t
	}
	for i, err := range trajectory.WriteFiles(s.st.episodesDir, ts) {
		if err != nil {
			s.storage.kick()
			return &apiError{Status: http.StatusServiceUnavailable, Code: codeStorageUnavailable, RetryAfter: 30,
				Message: fmt.Sprintf("line %d: the record could not be written: %v", fresh[i].line, err)}
		}
	}
	err = s.st.db.Update(func(tx *bolt.Tx) error {
		for i, rec := range recs {
			if err := put(tx, bucketEpisodes, rec.ID, rec); err != nil {
				return err
			}
			if ts[i].Outcomes.Status == trajectory.OutcomePending {
				if err := tx.Bucket(bucketMaturing).Put(maturingKey(*rec.MaturesAt, rec.ID), nil); err != nil {
					return err
				}
			}
		}
		for g, n := range counts {
			if err := tx.Bucket(bucketGroups).Put([]byte(g), []byte(strconv.Itoa(n))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.storage.kick()
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeStorageUnavailable, RetryAfter: 30,
			Message: fmt.Sprintf("the index could not take lines %d to %d: %v", fresh[0].line, fresh[len(fresh)-1].line, err)}
	}
	for _, ep := range fresh {
		refs = append(refs, ImportedRef{Line: ep.line, ID: ep.id, ExternalID: ep.externalID})
	}
	res.Accepted += len(fresh)
	s.metrics.Imported.Add(float64(len(fresh)))
	for _, t := range ts {
		for _, name := range t.Monitors.Triggered() {
			s.metrics.Monitors.WithLabelValues(name).Inc()
		}
	}
	return nil
}

// removeUnindexedImports removes the records of imported episodes that
// are not in the index: a process stopped between writing a chunk's
// records and indexing them (nothing of the chunk was acknowledged). It
// holds importMu, so no chunk is between the two meanwhile.
func (s *Server) removeUnindexedImports() ([]string, error) {
	s.importMu.Lock()
	defer s.importMu.Unlock()
	entries, err := os.ReadDir(s.st.episodesDir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && strings.HasPrefix(id, "imp-") {
			ids = append(ids, id)
		}
	}
	var stray []string
	err = s.st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEpisodes)
		for _, id := range ids {
			if b.Get([]byte(id)) == nil {
				stray = append(stray, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range stray {
		if err := os.Remove(s.st.trajectoryPath(id)); err != nil && !os.IsNotExist(err) {
			return stray, err
		}
	}
	return stray, nil
}

func (res *ImportResult) episode(ref ImportedRef) {
	if len(res.Episodes) < maxEpisodesListed {
		res.Episodes = append(res.Episodes, ref)
	} else {
		res.EpisodesOmitted++
	}
}

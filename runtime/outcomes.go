package runtime

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// OutcomeSpec is the outcome reward of imported episodes (rollbox serve
// --outcome-reward FILE, or a line's "outcome_reward"): a weighted sum of
// named signals, each with a default for when it never arrived, computed
// when the maturity window (from the import) closes. Until then the
// episode's reward is pending (a null total), never 0.
type OutcomeSpec struct {
	Type    string              `json:"type"` // "outcome"
	Signals []OutcomeSignalSpec `json:"signals"`
	// WindowS is the maturity window in seconds from the import (0: the
	// signals sent with the line are all there will be).
	WindowS float64 `json:"window_s"`
}

// OutcomeSignalSpec is one term of the sum.
type OutcomeSignalSpec struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
	// Default is the value of a signal that never arrived; without one, a
	// missing signal leaves the episode unscored (missing_signal).
	Default *float64 `json:"default,omitempty"`
	// Aggregate combines several signals of the name: last (by "at", else
	// as received; the default), first, mean, min, max, sum.
	Aggregate string `json:"aggregate,omitempty"`
}

// DefaultOutcomeSpec is the spec of a service given none: accepted counts
// 1, reverted -1, both 0 when absent, a 24-hour window.
func DefaultOutcomeSpec() *OutcomeSpec {
	zero := 0.0
	return &OutcomeSpec{Type: "outcome", WindowS: 86400, Signals: []OutcomeSignalSpec{
		{Name: "accepted", Weight: 1, Default: &zero}, {Name: "reverted", Weight: -1, Default: &zero}}}
}

func (sp *OutcomeSpec) window() time.Duration {
	return time.Duration(sp.WindowS * float64(time.Second))
}

var signalNameRe = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)

// maxOutcomeWindowS bounds a window (a year).
const maxOutcomeWindowS = 366 * 86400

// ParseOutcomeSpec reads and checks a spec; errors are *apiError naming
// the field.
func ParseOutcomeSpec(raw []byte) (*OutcomeSpec, error) {
	var sp OutcomeSpec
	if err := decodeStrict(raw, &sp, ""); err != nil {
		return nil, err
	}
	if sp.Type != "outcome" {
		return nil, badField("type", "%q: an outcome reward spec has type \"outcome\"", sp.Type)
	}
	if len(sp.Signals) == 0 {
		return nil, badField("signals", "name at least one signal")
	}
	if math.IsNaN(sp.WindowS) || sp.WindowS < 0 || sp.WindowS > maxOutcomeWindowS {
		return nil, badField("window_s", "%v is not between 0 and %d (a year)", sp.WindowS, maxOutcomeWindowS)
	}
	seen := map[string]bool{}
	for i, s := range sp.Signals {
		f := fmt.Sprintf("signals[%d]", i)
		if !signalNameRe.MatchString(s.Name) {
			return nil, badField(f+".name", "%q: use lower-case letters, digits, _ . - (at most 64)", s.Name)
		}
		if seen[s.Name] {
			return nil, badField(f+".name", "%q is named twice", s.Name)
		}
		seen[s.Name] = true
		if math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) {
			return nil, badField(f+".weight", "is not a finite number")
		}
		if s.Default != nil && (math.IsNaN(*s.Default) || math.IsInf(*s.Default, 0)) {
			return nil, badField(f+".default", "is not a finite number")
		}
		switch s.Aggregate {
		case "", "last", "first", "mean", "min", "max", "sum":
		default:
			return nil, badField(f+".aggregate", "%q is not one of last, first, mean, min, max, sum", s.Aggregate)
		}
	}
	return &sp, nil
}

// LoadOutcomeSpec reads a spec file.
func LoadOutcomeSpec(raw []byte, name string) (*OutcomeSpec, error) {
	sp, err := ParseOutcomeSpec(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return sp, nil
}

// signalIn is a signal as sent.
type signalIn struct {
	Name   string          `json:"name"`
	Value  json.RawMessage `json:"value"`
	At     string          `json:"at,omitempty"`
	Source string          `json:"source,omitempty"`
}

var signalSourceRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$`)

// maxSignals bounds the signals of one request and of one episode.
const (
	maxSignalsPerRequest = 1000
	maxSignalsPerEpisode = 10000
)

// parseSignals checks signals; values become numbers (true 1, false 0,
// "up" 1, "down" -1), "at" is normalised (RFC 3339, UTC) so the same
// instant written two ways is the same signal.
func parseSignals(in []signalIn, field string, now time.Time) ([]trajectory.Signal, *lineError) {
	if len(in) > maxSignalsPerRequest {
		return nil, fieldErr(field, "%d signals; at most %d at once", len(in), maxSignalsPerRequest)
	}
	out := make([]trajectory.Signal, 0, len(in))
	for i, s := range in {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !signalNameRe.MatchString(s.Name) {
			return nil, fieldErr(f+".name", "%q: use lower-case letters, digits, _ . - (at most 64): accepted, reverted, thumbs, tests_passed, ...", s.Name)
		}
		sig := trajectory.Signal{Name: s.Name, Source: s.Source, Recv: now}
		if s.Source != "" && !signalSourceRe.MatchString(s.Source) {
			return nil, fieldErr(f+".source", "%q: use letters, digits and . _ : / - (at most 64)", s.Source)
		}
		v := bytes.TrimSpace(s.Value)
		switch {
		case len(v) == 0 || string(v) == "null":
			return nil, fieldErr(f+".value", "is required: a number, true/false, or \"up\"/\"down\"")
		case string(v) == "true":
			sig.Value, sig.Raw = 1, json.RawMessage("true")
		case string(v) == "false":
			sig.Value, sig.Raw = 0, json.RawMessage("false")
		case v[0] == '"':
			var str string
			json.Unmarshal(v, &str)
			switch strings.ToLower(str) {
			case "up", "thumbs_up", "+1":
				sig.Value = 1
			case "down", "thumbs_down", "-1":
				sig.Value = -1
			default:
				return nil, fieldErr(f+".value", "%q is not a number, true/false, or \"up\"/\"down\"", str)
			}
			sig.Raw, _ = json.Marshal(str)
		default:
			if err := json.Unmarshal(v, &sig.Value); err != nil || math.IsNaN(sig.Value) || math.IsInf(sig.Value, 0) {
				return nil, fieldErr(f+".value", "%s is not a finite number, true/false, or \"up\"/\"down\"", v)
			}
		}
		if s.At != "" {
			at, err := time.Parse(time.RFC3339Nano, s.At)
			if err != nil {
				return nil, fieldErr(f+".at", "%q is not an RFC 3339 time", s.At)
			}
			sig.At = at.UTC().Format(time.RFC3339Nano)
		}
		out = append(out, sig)
	}
	return out, nil
}

// signalKey is what makes two signals the same one: name, at, source.
func signalKey(s trajectory.Signal) string { return s.Name + "\x00" + s.At + "\x00" + s.Source }

// addSignals adds new signals to o, late ones marked so when the window
// has closed; it returns how many were added, were duplicates, were late.
func addSignals(o *trajectory.Outcomes, in []trajectory.Signal) (added, dups, late int, err error) {
	have := map[string]bool{}
	for _, s := range o.Signals {
		have[signalKey(s)] = true
	}
	for _, s := range in {
		k := signalKey(s)
		if have[k] {
			dups++
			continue
		}
		if len(o.Signals) >= maxSignalsPerEpisode {
			return added, dups, late, fmt.Errorf("the episode has %d signals, the most one keeps", maxSignalsPerEpisode)
		}
		have[k] = true
		if o.Status == trajectory.OutcomeScored {
			s.Late = true
			late++
		}
		o.Signals = append(o.Signals, s)
		added++
	}
	return added, dups, late, nil
}

// scoreOutcome computes the reward of an episode whose window closed.
func scoreOutcome(sp *OutcomeSpec, sigs []trajectory.Signal) *trajectory.Reward {
	by := map[string][]trajectory.Signal{}
	for _, s := range sigs {
		if !s.Late {
			by[s.Name] = append(by[s.Name], s)
		}
	}
	comps := map[string]float64{}
	var details []string
	total := 0.0
	var missing []string
	for _, term := range sp.Signals {
		got := by[term.Name]
		var v float64
		if len(got) == 0 {
			if term.Default == nil {
				missing = append(missing, term.Name)
				continue
			}
			v = *term.Default
			details = append(details, fmt.Sprintf("%s: no signal, default %g × weight %g", term.Name, v, term.Weight))
		} else {
			v = aggregate(term.Aggregate, got)
			agg := term.Aggregate
			if agg == "" {
				agg = "last"
			}
			details = append(details, fmt.Sprintf("%s: %g (%s of %d) × weight %g", term.Name, v, agg, len(got), term.Weight))
		}
		comps[term.Name] = v
		total += term.Weight * v
	}
	if len(missing) > 0 {
		return trajectory.Unscored(trajectory.RewardMissingSignal, comps,
			fmt.Sprintf("the window closed without %s, which the outcome spec gives no default", strings.Join(missing, ", ")))
	}
	return &trajectory.Reward{Total: &total, Components: comps, Details: details}
}

// aggregate combines one name's signals; "last" and "first" order them by
// "at" (signals without one after those with, in the order received).
func aggregate(how string, sigs []trajectory.Signal) float64 {
	switch how {
	case "mean", "sum", "min", "max":
		acc := sigs[0].Value
		sum := 0.0
		for _, s := range sigs {
			sum += s.Value
			acc = map[string]func(a, b float64) float64{"min": math.Min, "max": math.Max}[how](acc, s.Value)
		}
		if how == "sum" {
			return sum
		}
		if how == "mean" {
			return sum / float64(len(sigs))
		}
		return acc
	}
	ordered := append([]trajectory.Signal(nil), sigs...)
	sort.SliceStable(ordered, func(i, j int) bool {
		a, b := ordered[i], ordered[j]
		if (a.At == "") != (b.At == "") {
			return b.At == ""
		}
		if a.At != b.At {
			ta, _ := time.Parse(time.RFC3339Nano, a.At)
			tb, _ := time.Parse(time.RFC3339Nano, b.At)
			return ta.Before(tb)
		}
		return false
	})
	if how == "first" {
		return ordered[0].Value
	}
	return ordered[len(ordered)-1].Value
}

// pendingReward is the reward of an episode whose window is open.
func pendingReward(maturesAt time.Time) *trajectory.Reward {
	return trajectory.Unscored(trajectory.RewardPending, nil,
		"the outcome window closes at "+maturesAt.UTC().Format(time.RFC3339)+"; scored then from the signals received")
}

// matureIfDue scores t when its window has closed at now; it reports
// whether it did.
func matureIfDue(t *trajectory.Trajectory, now time.Time) (bool, error) {
	o := t.Outcomes
	if o == nil || o.Status != trajectory.OutcomePending || now.Before(o.MaturesAt) {
		return false, nil
	}
	sp, err := ParseOutcomeSpec(o.Spec)
	if err != nil {
		return false, fmt.Errorf("episode %s: its outcome spec: %v", t.EpisodeID, err)
	}
	t.Reward = scoreOutcome(sp, o.Signals)
	o.Status = trajectory.OutcomeScored
	at := now.UTC()
	o.ScoredAt = &at
	return true, nil
}

// bucketMaturing indexes pending imported episodes by when their window
// closes: key = big-endian unix nanoseconds + episode id.
var bucketMaturing = []byte("maturing")

func maturingKey(at time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(at.UnixNano()))
	return append(k, id...)
}

// OutcomeResult is the answer to POST /v1/episodes/{id}/outcomes.
type OutcomeResult struct {
	ID         string             `json:"id"`
	Added      int                `json:"added"`
	Duplicates int                `json:"duplicates"`
	Late       int                `json:"late"`
	Status     string             `json:"status"`
	MaturesAt  time.Time          `json:"matures_at"`
	Reward     *trajectory.Reward `json:"reward"`
}

// postOutcomes adds outcome signals to an imported episode: any number of
// times, in any order; a signal already received (same name, at and
// source) is a duplicate and changes nothing; one received after the
// window closed is recorded as late and changes nothing either. Durable
// before the answer.
func (s *Server) postOutcomes(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	body, err := readBody(w, r, maxEnvRequestBody)
	if err != nil {
		return err
	}
	var req struct {
		Signals []signalIn `json:"signals"`
	}
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if len(req.Signals) == 0 {
		return badField("signals", "send at least one signal {\"name\", \"value\", \"at\"?, \"source\"?}")
	}
	rec, err := s.st.episode(id)
	if err != nil {
		return err
	}
	if rec == nil || !ownedBy(rec.Tenant, tenantOf(r)) {
		return notFound("episode", id)
	}
	if rec.Mode != modeImport {
		return &apiError{Status: http.StatusConflict, Code: codeNotImported, Field: "id",
			Message: fmt.Sprintf("episode %q is a %s episode: outcome signals are for imported episodes (POST /v1/imports); a rollout's reward is its task's", id, rec.Mode)}
	}
	now := s.now()
	sigs, le := parseSignals(req.Signals, "signals", now)
	if le != nil {
		return badField(le.Field, "%s", le.Message)
	}
	s.outcomeMu.Lock()
	defer s.outcomeMu.Unlock()
	t, err := trajectory.Read(s.st.trajectoryPath(id))
	if err != nil {
		return fmt.Errorf("episode %s: reading its record: %w", id, err)
	}
	if t.Outcomes == nil {
		return fmt.Errorf("episode %s: its record has no outcomes", id)
	}
	res := OutcomeResult{ID: id}
	// A window that closed before these signals arrived is scored first:
	// they are late.
	matured, err := matureIfDue(t, now)
	if err != nil {
		return err
	}
	res.Added, res.Duplicates, res.Late, err = addSignals(t.Outcomes, sigs)
	if err != nil {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: codeTooLarge, Field: "signals", Message: err.Error()}
	}
	if res.Added > 0 || matured {
		if err := s.saveOutcome(rec, t); err != nil {
			return err
		}
	}
	res.Status, res.MaturesAt, res.Reward = t.Outcomes.Status, t.Outcomes.MaturesAt, t.Reward
	writeHTTPJSON(w, http.StatusOK, res)
	return nil
}

// saveOutcome writes an imported episode's record (durably) and its index
// entry; the caller holds outcomeMu.
func (s *Server) saveOutcome(rec *episodeRecord, t *trajectory.Trajectory) error {
	if err := trajectory.WriteFile(s.st.trajectoryPath(t.EpisodeID), t); err != nil {
		s.storage.kick()
		return &apiError{Status: http.StatusServiceUnavailable, Code: codeStorageUnavailable, RetryAfter: 30,
			Message: fmt.Sprintf("the record of episode %s could not be written: %v (nothing was changed)", t.EpisodeID, err)}
	}
	scored := t.Outcomes.Status == trajectory.OutcomeScored
	setImportOutcome(rec, t)
	return s.st.db.Update(func(tx *bolt.Tx) error {
		if scored {
			tx.Bucket(bucketMaturing).Delete(maturingKey(*rec.MaturesAt, rec.ID))
		}
		return put(tx, bucketEpisodes, rec.ID, rec)
	})
}

// setImportOutcome copies an imported record's outcome into its index entry.
func setImportOutcome(rec *episodeRecord, t *trajectory.Trajectory) {
	rec.Outcome = t.Outcomes.Status
	rec.Reward = nil
	if v, ok := t.Value(); ok {
		rec.Reward = &v
	}
}

// matureDue scores every imported episode whose window closed by now, in
// batches (one file-system sync and one transaction a batch). The
// background sweep calls it, and every reader of imported episodes before
// it reads, so nothing is read pending after its window closed.
func (s *Server) matureDue(now time.Time) error {
	s.outcomeMu.Lock()
	defer s.outcomeMu.Unlock()
	for {
		var keys [][]byte
		err := s.st.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketMaturing).Cursor()
			limit := maturingKey(now, "")
			for k, _ := c.First(); k != nil && len(keys) < 256; k, _ = c.Next() {
				if bytes.Compare(k[:8], limit[:8]) > 0 {
					break
				}
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil || len(keys) == 0 {
			return err
		}
		var ts []*trajectory.Trajectory
		var recs []*episodeRecord
		var done [][]byte
		for _, k := range keys {
			id := string(k[8:])
			rec, err := s.st.episode(id)
			if err != nil {
				return err
			}
			var t *trajectory.Trajectory
			if rec != nil {
				t, err = trajectory.Read(s.st.trajectoryPath(id))
			}
			if rec == nil || err != nil || t.Outcomes == nil {
				if err != nil {
					s.log.Error("an imported episode's record cannot be read to score it", "episode", id, "err", err)
				}
				done = append(done, k)
				continue
			}
			if _, err := matureIfDue(t, now); err != nil {
				s.log.Error("scoring an imported episode", "episode", id, "err", err)
				done = append(done, k)
				continue
			}
			done = append(done, k)
			ts, recs = append(ts, t), append(recs, rec)
		}
		for i, err := range trajectory.WriteFiles(s.st.episodesDir, ts) {
			if err != nil {
				s.storage.kick()
				return fmt.Errorf("episode %s: writing its scored record: %w", ts[i].EpisodeID, err)
			}
		}
		err = s.st.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketMaturing)
			for _, k := range done {
				b.Delete(k)
			}
			for i, rec := range recs {
				setImportOutcome(rec, ts[i])
				if err := put(tx, bucketEpisodes, rec.ID, rec); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.metrics.OutcomesScored.Add(float64(len(recs)))
	}
}

// sweepOutcomes scores matured episodes every OutcomeCheckEvery until ctx
// ends.
func (s *Server) sweepOutcomes(done <-chan struct{}) {
	t := time.NewTicker(s.limits.OutcomeCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if err := s.matureDue(s.now()); err != nil && !errors.Is(err, bolt.ErrDatabaseNotOpen) {
				s.log.Error("scoring matured imported episodes", "err", err)
			}
		}
	}
}

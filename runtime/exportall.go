package runtime

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// exportFilter selects the episodes of GET /v1/export.
type exportFilter struct {
	sources       map[string]bool // empty: all
	since, until  *time.Time      // on the episode's end
	policyVersion string
	outcome       string // "", pending, scored
}

func parseExportFilter(r *http.Request) (*exportFilter, error) {
	q := r.URL.Query()
	f := &exportFilter{sources: map[string]bool{}, policyVersion: q.Get("policy_version"), outcome: q.Get("outcome")}
	for _, v := range q["source"] {
		for _, src := range strings.Split(v, ",") {
			if src = strings.TrimSpace(src); src != "" {
				f.sources[src] = true
			}
		}
	}
	for name, dst := range map[string]**time.Time{"since": &f.since, "until": &f.until} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, badField(name, "%q is not an RFC 3339 time", v)
			}
			*dst = &t
		}
	}
	switch f.outcome {
	case "", trajectory.OutcomePending, trajectory.OutcomeScored:
	default:
		return nil, badField("outcome", "%q is not one of pending, scored", f.outcome)
	}
	return f, nil
}

// sourceOfRecord is an index entry's source.
func sourceOfRecord(rec *episodeRecord) string {
	switch {
	case rec.Source != "":
		return rec.Source
	case rec.Mode == "rollout":
		return trajectory.SourceRollout
	}
	return trajectory.SourceEnv
}

// exportEpisodes writes every ended episode the caller owns that the
// filters select, rollouts and imports alike, in the rollout export's
// format and columns (?format=jsonl|parquet, ?layout=episodes|segments),
// with the group statistics of each group over the episodes exported (the
// same statistics and zero-variance flag as a rollout's). Filters: source
// (rollout, env, production or an importer's label; repeated or
// comma-separated), since/until (RFC 3339, on the episode's end),
// policy_version, outcome (pending, scored). Imported episodes whose
// window has closed are scored first.
func (s *Server) exportEpisodes(w http.ResponseWriter, r *http.Request) error {
	f, err := parseExportFilter(r)
	if err != nil {
		return err
	}
	format, layout := r.URL.Query().Get("format"), r.URL.Query().Get("layout")
	if format == "" {
		format = "jsonl"
	}
	if format != "jsonl" && format != "parquet" {
		return badField("format", "%q is not one of jsonl, parquet", format)
	}
	if layout == "" {
		layout = LayoutEpisodes
	}
	if layout != LayoutEpisodes && layout != LayoutSegments {
		return badField("layout", "%q is not one of episodes, segments", layout)
	}
	if err := s.matureDue(s.now()); err != nil {
		return err
	}
	tenant := tenantOf(r)
	var recs []*episodeRecord
	rolloutTenant := map[string]string{}
	err = s.st.db.View(func(tx *bolt.Tx) error {
		ro := tx.Bucket(bucketRollouts)
		return tx.Bucket(bucketEpisodes).ForEach(func(_, v []byte) error {
			rec := &episodeRecord{}
			if err := json.Unmarshal(v, rec); err != nil {
				return err
			}
			if rec.State != episodeDone || rec.Reason == trajectory.EndRecordError {
				return nil
			}
			owner := rec.Tenant
			if rec.Mode == "rollout" {
				o, ok := rolloutTenant[rec.RolloutID]
				if !ok {
					rr := &rolloutRecord{}
					if b := ro.Get([]byte(rec.RolloutID)); b != nil && json.Unmarshal(b, rr) == nil {
						o = rr.Tenant
					}
					rolloutTenant[rec.RolloutID] = o
				}
				owner = o
			}
			if !ownedBy(owner, tenant) {
				return nil
			}
			if len(f.sources) > 0 && !f.sources[sourceOfRecord(rec)] {
				return nil
			}
			if f.outcome != "" && rec.Outcome != f.outcome {
				return nil
			}
			if rec.EndedAt != nil && (f.since != nil && rec.EndedAt.Before(*f.since) || f.until != nil && !rec.EndedAt.Before(*f.until)) {
				return nil
			}
			if f.policyVersion != "" && rec.Mode == modeImport && rec.PolicyVersion != f.policyVersion {
				return nil
			}
			recs = append(recs, rec)
			return nil
		})
	})
	if err != nil {
		return err
	}
	var ts []*trajectory.Trajectory
	skipped := 0
	for _, rec := range recs {
		t, err := trajectory.Read(s.st.trajectoryPath(rec.ID))
		if err != nil {
			s.log.Warn("an episode has no readable record; left out of the export", "episode", rec.ID, "err", err)
			skipped++
			continue
		}
		if f.policyVersion != "" && rec.Mode != modeImport && t.Stats.PolicyVersions[f.policyVersion] == 0 {
			continue
		}
		t.Group = nil
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].GroupID != ts[j].GroupID {
			return ts[i].GroupID < ts[j].GroupID
		}
		return ts[i].GroupIndex < ts[j].GroupIndex
	})
	AttachGroupStats(ts)
	if skipped > 0 {
		w.Header().Set(skippedCountHeader, strconv.Itoa(skipped))
	}
	name := "episodes." + format
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s"`, name))
	if format == "jsonl" {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "application/vnd.apache.parquet")
	}
	return WriteExport(s.longAnswer(w), ts, format, layout)
}

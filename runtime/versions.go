package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rollbox/rollbox/agent/openai"
)

// tokenPolicy opens a token-mode policy, probing the server's tokenizer:
// a server that cannot serve token mode refuses the rollout at admission.
// A server that answered (404, a template token mode cannot continue) is
// bad input, a 400 naming <field>.mode; one that could not be reached is a
// 503 to retry. field is the policy object's ("policy", or a sub-agent
// policy's).
func (s *Server) tokenPolicy(ctx context.Context, cfg openai.Config, field string) (*openai.TokenPolicy, error) {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if cfg.MaxRetries == 0 || cfg.MaxRetries > 2 {
		cfg.MaxRetries = 2
	}
	tp, err := openai.NewTokens(pctx, cfg)
	if err == nil {
		return tp, nil
	}
	var ce *openai.CallError
	if errors.As(err, &ce) && (ce.StatusCode == 0 && ce.Attempts > 0 && ce.Err != nil || ce.StatusCode >= 500) {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Code: "policy_unavailable", Field: field + ".base_url",
			Message: fmt.Sprintf("token mode needs the policy server's tokenizer, which could not be reached: %v", err), RetryAfter: 5}
	}
	if ctx.Err() == nil && pctx.Err() != nil {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Code: "policy_unavailable", Field: field + ".base_url",
			Message: fmt.Sprintf("token mode: the policy server's tokenizer did not answer in 30s: %v", err), RetryAfter: 5}
	}
	return nil, badField(field+".mode", "%v", err)
}

// initialVersion is a new rollout's policy version: its own, else the last
// one its tenant announced.
func (s *Server) initialVersion(v, tenant string) string {
	if v != "" {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policyVersions[tenant]
}

// versionStatusLocked fills a status's version fields.
func (r *rollout) versionStatusLocked(st *RolloutStatus) {
	if n := len(r.versions); n > 0 {
		st.PolicyVersion = r.versions[n-1]
	}
	if len(r.versionTurns) > 0 {
		st.PolicyVersions = copyCounts(r.versionTurns)
	}
	if r.maxStaleness >= 0 {
		m := r.maxStaleness
		st.MaxStaleness = &m
	}
}

// errStale is the cause of an episode cancelled for a stale policy version.
type errStale struct {
	first, now string
	newer, max int
}

func (e *errStale) Error() string {
	return fmt.Sprintf("policy version stale: the episode's first turn was sampled under %q and %d newer version(s) were announced since (now %q), more than max_staleness %d",
		e.first, e.newer, e.now, e.max)
}

// staleLocked is why e is stale, or nil.
func (r *rollout) staleLocked(e *episodeState) error {
	return staleness(r.versions, r.maxStaleness, e.versionAt)
}

// staleness is why an episode whose first turn was sampled under
// versions[at-1] (at 0: no turn yet) is stale now that versions were
// announced, or nil; maxStaleness < 0 is none.
func staleness(versions []string, maxStaleness, at int) error {
	if maxStaleness < 0 || at == 0 {
		return nil
	}
	first, cur := at-1, len(versions)-1
	if cur-first <= maxStaleness {
		return nil
	}
	return &errStale{first: versions[first], now: versions[cur], newer: cur - first, max: maxStaleness}
}

// versioner gives each policy call of an episode the version it is
// sampled under (gatedPolicy): the rollout's on one host, the worker's
// copy of it on a cluster worker.
type versioner interface {
	versionFor() (string, error)
}

// episodeVersions is a single-host episode's versioner.
type episodeVersions struct {
	r *rollout
	e *episodeState
}

func (v episodeVersions) versionFor() (string, error) { return v.r.versionFor(v.e) }

// versionFor is the version a turn of e is sampled under now. It pins the
// episode's first version on its first turn. When the episode is stale it
// is cancelled (with the reason as the cause) and the error returned.
func (r *rollout) versionFor(e *episodeState) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.staleLocked(e); err != nil {
		if e.cancel != nil {
			e.cancel(err)
		}
		return "", err
	}
	if len(r.versions) == 0 {
		return "", nil
	}
	if e.versionAt == 0 {
		e.versionAt = len(r.versions)
	}
	return r.versions[len(r.versions)-1], nil
}

// announce makes v the rollout's current version and cancels its running
// episodes that are now stale. It returns how many it cancelled and
// whether v is new to the rollout.
func (r *rollout) announce(v string) (cancelled int, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if terminalState(r.rec.State) || (len(r.versions) > 0 && r.versions[len(r.versions)-1] == v) {
		return 0, false
	}
	r.versions = append(r.versions, v)
	n := 0
	for _, e := range r.episodes {
		if e.cancel == nil || e.session == nil || e.rec.State == episodeDone {
			continue
		}
		if err := r.staleLocked(e); err != nil {
			e.cancel(err)
			n++
		}
	}
	r.notifyLocked()
	return n, true
}

// announceTo announces v to ro; on a coordinator the workers running its
// episodes cancel theirs that are now stale. It returns how many episodes
// were cancelled.
func (s *Server) announceTo(ro *rollout, v string) int {
	n, changed := ro.announce(v)
	if changed && s.coord != nil {
		n += s.coord.announce(ro)
	}
	return n
}

// PolicyVersionResult is the answer to an announcement: the version and,
// for each live rollout it reached, how many episodes it cancelled as
// stale.
type PolicyVersionResult struct {
	Version  string                 `json:"version"`
	Rollouts []PolicyVersionRollout `json:"rollouts"`
}

// PolicyVersionRollout is one rollout an announcement reached.
type PolicyVersionRollout struct {
	ID        string `json:"id"`
	Cancelled int    `json:"cancelled"`
}

func (s *Server) readVersion(w http.ResponseWriter, r *http.Request) (string, error) {
	body, err := readBody(w, r, 1<<16)
	if err != nil {
		return "", err
	}
	var req PolicyVersionRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return "", err
	}
	if req.Version == "" || len(req.Version) > 256 {
		return "", badField("version", "want a non-empty string of at most 256 bytes")
	}
	return req.Version, nil
}

// postPolicyVersion announces a version to every live rollout and makes it
// the default of rollouts submitted later without one.
func (s *Server) postPolicyVersion(w http.ResponseWriter, r *http.Request) error {
	v, err := s.readVersion(w, r)
	if err != nil {
		return err
	}
	tenant := tenantOf(r)
	s.mu.Lock()
	if s.policyVersions == nil {
		s.policyVersions = map[string]string{}
	}
	s.policyVersions[tenant] = v
	live := make([]*rollout, 0, len(s.rollouts))
	for _, ro := range s.rollouts {
		if ownedBy(ro.rec.Tenant, tenant) { // another tenant's trainer has its own versions
			live = append(live, ro)
		}
	}
	s.mu.Unlock()
	res := PolicyVersionResult{Version: v, Rollouts: []PolicyVersionRollout{}}
	for _, ro := range live {
		ro.mu.Lock()
		ended := terminalState(ro.rec.State)
		ro.mu.Unlock()
		if !ended {
			res.Rollouts = append(res.Rollouts, PolicyVersionRollout{ID: ro.id, Cancelled: s.announceTo(ro, v)})
		}
	}
	s.log.Info("policy version announced", "version", v, "rollouts", len(res.Rollouts))
	writeHTTPJSON(w, http.StatusOK, res)
	return nil
}

// postRolloutPolicyVersion announces a version to one rollout.
func (s *Server) postRolloutPolicyVersion(w http.ResponseWriter, r *http.Request) error {
	ro, err := s.lookupRollout(r.PathValue("id"), tenantOf(r))
	if err != nil {
		return err
	}
	v, err := s.readVersion(w, r)
	if err != nil {
		return err
	}
	ro.mu.Lock()
	ended := terminalState(ro.rec.State)
	ro.mu.Unlock()
	if ended {
		return &apiError{Status: http.StatusConflict, Code: "rollout_ended", Field: "id", Message: fmt.Sprintf("rollout %s has ended", ro.id)}
	}
	n := s.announceTo(ro, v)
	writeHTTPJSON(w, http.StatusOK, PolicyVersionResult{Version: v, Rollouts: []PolicyVersionRollout{{ID: ro.id, Cancelled: n}}})
	return nil
}

package judge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// DefaultConcurrency bounds a judge endpoint's requests in flight when
// neither the pool's options nor the spec say.
const DefaultConcurrency = 8

// Options configure a Pool.
type Options struct {
	// Concurrency bounds each endpoint's requests in flight (default 8;
	// a judge's max_concurrency sets its endpoint's instead).
	Concurrency int
	// Cache keeps answers (default an in-memory cache of 100,000).
	Cache Cache
	// APIKey returns the value of a judge's api_key_env (the command reads
	// the environment; nil sends no key).
	APIKey func(env string) string
	// Observe, if set, sees every request and cache hit (metrics).
	Observe func(Event)
	// HTTPClient makes the requests (default one with no overall timeout:
	// each request has the judge's own).
	HTTPClient *http.Client
	// Backoff is the wait before a failed request's first retry, doubled
	// for each later one up to 16 times it (default DefaultBackoff); a
	// Retry-After the judge answered is waited instead (at most 10 s).
	Backoff time.Duration
}

// DefaultBackoff is Options.Backoff's default.
const DefaultBackoff = 250 * time.Millisecond

// Event is one judge request or cache hit.
type Event struct {
	BaseURL string
	Model   string
	// Outcome is "ok", "cached", "retry" (a failed attempt that will be
	// retried) or "error" (the last attempt failed).
	Outcome string
	// Latency is the request's time; Wait the time spent waiting for one
	// of the endpoint's slots.
	Latency, Wait time.Duration
	Tokens        int64
}

// Pool is what every episode's judging shares: the bound per endpoint and
// the cache. Safe for concurrent use.
type Pool struct {
	opts   Options
	client *http.Client

	mu        sync.Mutex
	endpoints map[string]chan struct{} // base URL → slots
	flights   map[string]*flight       // key → the request in flight
}

// flight is a request in flight that identical ones wait for instead of
// asking again (the episodes of a group often show a judge the same).
type flight struct {
	done chan struct{}
	s    *trajectory.JudgeSample
}

// NewPool makes a pool.
func NewPool(o Options) *Pool {
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Cache == nil {
		o.Cache = NewMemoryCache(100000)
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	c := o.HTTPClient
	if c == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		c = &http.Client{Transport: tr}
	}
	return &Pool{opts: o, client: c, endpoints: map[string]chan struct{}{}, flights: map[string]*flight{}}
}

// Cache is the pool's cache.
func (p *Pool) Cache() Cache { return p.opts.Cache }

func (p *Pool) slots(e *Endpoint) chan struct{} {
	key := strings.TrimRight(e.BaseURL, "/")
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.endpoints[key]
	if ch == nil {
		n := p.opts.Concurrency
		if e.MaxConcurrency > 0 {
			n = e.MaxConcurrency
		}
		ch = make(chan struct{}, n)
		p.endpoints[key] = ch
	}
	return ch
}

// Judge asks every judge every rubric of spec about ep (samples times
// each) and combines the scores. The record's Score is nil, and Error says
// why, when a request failed after its retries or the judging's deadline
// passed: the reward is then unscored.
func (p *Pool) Judge(ctx context.Context, spec *Spec, ep *Episode) *trajectory.Judge {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, spec.deadline())
	defer cancel()
	agg := spec.aggregate()
	rec := &trajectory.Judge{Aggregate: agg.Judges, Rubrics: []trajectory.JudgeRubric{}, Judges: []trajectory.JudgeScores{}}
	k := spec.samples()
	type slot struct {
		rubric, judge, sample int
	}
	samples := map[slot]*trajectory.JudgeSample{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	rubricViews := make([][]view, len(spec.Rubrics))
	for ri := range spec.Rubrics {
		r := &spec.Rubrics[ri]
		vs := views(r, ep)
		rubricViews[ri] = vs
		msgs := messages(r, vs)
		for ji := range spec.Judges {
			e := &spec.Judges[ji]
			if !judges(spec, r, e) {
				continue
			}
			for si := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := p.sample(ctx, e, r, msgs, si)
					mu.Lock()
					samples[slot{ri, ji, si}] = s
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()

	var failures []string
	rubricScores := make([]float64, len(spec.Rubrics))
	weights := make([]float64, len(spec.Rubrics))
	byJudge := make([][]float64, len(spec.Judges)) // judge → its rubric scores
	byJudgeW := make([][]float64, len(spec.Judges))
	for ji := range spec.Judges {
		e := &spec.Judges[ji]
		js := trajectory.JudgeScores{Name: e.Name, BaseURL: e.BaseURL, Model: e.Model, Rubrics: []trajectory.JudgeRubricScores{}}
		for ri := range spec.Rubrics {
			r := &spec.Rubrics[ri]
			if !judges(spec, r, e) {
				continue
			}
			rs := trajectory.JudgeRubricScores{Rubric: r.Name, Samples: []trajectory.JudgeSample{}}
			var vals []float64
			for si := range k {
				s := samples[slot{ri, ji, si}]
				rec.Calls++
				if s.Cached {
					rec.CacheHits++
				}
				rs.Samples = append(rs.Samples, *s)
				if s.Score == nil {
					failures = append(failures, fmt.Sprintf("judge %s, rubric %s, sample %d: %s", e.Name, r.Name, si+1, s.Error))
					continue
				}
				vals = append(vals, *s.Score)
			}
			if len(vals) == k {
				v := round9(mean(vals))
				rs.Score = &v
				byJudge[ji] = append(byJudge[ji], v)
				byJudgeW[ji] = append(byJudgeW[ji], r.weight())
			}
			js.Rubrics = append(js.Rubrics, rs)
		}
		if len(byJudge[ji]) == len(js.Rubrics) && len(js.Rubrics) > 0 {
			if v := WeightedMean(byJudge[ji], byJudgeW[ji]); !math.IsNaN(v) {
				v = round9(v)
				js.Score = &v
			}
		}
		rec.Judges = append(rec.Judges, js)
	}
	for ri := range spec.Rubrics {
		r := &spec.Rubrics[ri]
		jr := trajectory.JudgeRubric{Name: r.Name, Weight: r.weight(), ByJudge: map[string]float64{}, Views: []trajectory.JudgeView{}}
		for _, v := range rubricViews[ri] {
			jr.Views = append(jr.Views, v.rec)
		}
		var vals []float64
		complete := true
		for ji := range spec.Judges {
			e := &spec.Judges[ji]
			if !judges(spec, r, e) {
				continue
			}
			found := false
			for _, rs := range rec.Judges[ji].Rubrics {
				if rs.Rubric == r.Name && rs.Score != nil {
					jr.ByJudge[e.Name] = *rs.Score
					vals = append(vals, *rs.Score)
					found = true
				}
			}
			complete = complete && found
		}
		if len(vals) >= 2 {
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, v := range vals {
				lo, hi = min(lo, v), max(hi, v)
			}
			rec.Spread = max(rec.Spread, round9(hi-lo))
		}
		if complete && len(vals) > 0 {
			v := round9(Combine(agg.Judges, agg.Trim, vals))
			jr.Score = &v
			rubricScores[ri] = v
		}
		weights[ri] = r.weight()
		rec.Rubrics = append(rec.Rubrics, jr)
	}
	rec.DurationMS = float64(time.Since(start)) / float64(time.Millisecond)
	if len(failures) > 0 {
		rec.Error = failures[0]
		if len(failures) > 1 {
			rec.Error += fmt.Sprintf(" (and %d more failed)", len(failures)-1)
		}
		return rec
	}
	v := round9(WeightedMean(rubricScores, weights))
	rec.Score = &v
	return rec
}

func judges(spec *Spec, r *Rubric, e *Endpoint) bool {
	for _, j := range spec.JudgesOf(r) {
		if j == e {
			return true
		}
	}
	return false
}

// chatMessage is one message of a judge request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Key is the cache key of a request: the judge (endpoint, model, sampling),
// the sample index and the messages (the rubric and the content shown).
func Key(e *Endpoint, msgs []chatMessage, sample int) string {
	b, _ := json.Marshal(struct {
		BaseURL     string        `json:"base_url"`
		Model       string        `json:"model"`
		Temperature *float64      `json:"temperature"`
		MaxTokens   int           `json:"max_tokens"`
		Sample      int           `json:"sample"`
		Messages    []chatMessage `json:"messages"`
	}{strings.TrimRight(e.BaseURL, "/"), e.Model, e.Temperature, e.maxTokens(), sample, msgs})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// sample gets one score: from the cache, from an identical request in
// flight, else by asking the judge, with retries. It always returns a
// record; Score is nil when it failed.
func (p *Pool) sample(ctx context.Context, e *Endpoint, r *Rubric, msgs []chatMessage, index int) *trajectory.JudgeSample {
	key := Key(e, msgs, index)
	p.mu.Lock()
	if f := p.flights[key]; f != nil {
		p.mu.Unlock()
		select {
		case <-f.done:
			s := *f.s
			if s.Score != nil {
				s.Cached = true
				p.observe(Event{BaseURL: e.BaseURL, Model: e.Model, Outcome: "cached"})
			}
			return &s
		case <-ctx.Done():
			return &trajectory.JudgeSample{Key: key, Error: "the judging's deadline passed waiting for an identical request: " + ctx.Err().Error()}
		}
	}
	f := &flight{done: make(chan struct{})}
	p.flights[key] = f
	p.mu.Unlock()
	f.s = p.ask1(ctx, e, r, msgs, key)
	p.mu.Lock()
	delete(p.flights, key)
	p.mu.Unlock()
	close(f.done)
	return f.s
}

// ask1 is sample without the sharing of identical requests in flight.
func (p *Pool) ask1(ctx context.Context, e *Endpoint, r *Rubric, msgs []chatMessage, key string) *trajectory.JudgeSample {
	s := &trajectory.JudgeSample{Key: key}
	if ent, ok := p.opts.Cache.Get(key); ok {
		if parsed, err := Parse(ent.Text, r.Name, r.Scale); err == nil {
			fill(s, ent, parsed)
			s.Cached = true
			p.observe(Event{BaseURL: e.BaseURL, Model: e.Model, Outcome: "cached"})
			return s
		}
	}
	tries := 1 + e.retries()
	var lastErr error
	for attempt := 1; attempt <= tries; attempt++ {
		if attempt > 1 {
			if err := sleep(ctx, backoff(attempt-1, lastErr, p.opts.Backoff)); err != nil {
				lastErr = fmt.Errorf("the judging's deadline passed before attempt %d: %w (last: %v)", attempt, err, lastErr)
				break
			}
		}
		s.Attempts = attempt
		ent, err := p.ask(ctx, e, msgs)
		if err == nil {
			s.Text = ent.Text
			var parsed Parsed
			parsed, err = Parse(ent.Text, r.Name, r.Scale)
			if err == nil {
				fill(s, ent, parsed)
				p.opts.Cache.Put(key, ent)
				p.observe(Event{BaseURL: e.BaseURL, Model: e.Model, Outcome: "ok", Latency: ms(ent.LatencyMS), Wait: ent.wait, Tokens: tokens(ent.Usage)})
				return s
			}
			err = &unparseable{err}
			s.Model, s.LatencyMS, s.Usage = ent.Model, ent.LatencyMS, ent.Usage
		}
		lastErr = err
		var fatal *fatalError
		outcome := "retry"
		if attempt == tries || errors.As(err, &fatal) || ctx.Err() != nil {
			outcome = "error"
		}
		p.observe(Event{BaseURL: e.BaseURL, Model: e.Model, Outcome: outcome})
		if outcome == "error" {
			break
		}
	}
	s.Error = lastErr.Error()
	return s
}

func fill(s *trajectory.JudgeSample, ent Entry, parsed Parsed) {
	v := parsed.Score
	s.Score, s.Raw, s.Reason, s.Parse = &v, parsed.Raw, parsed.Reason, parsed.How
	s.Text, s.Model, s.LatencyMS, s.Usage = ent.Text, ent.Model, ent.LatencyMS, ent.Usage
	s.Error = ""
}

func tokens(u *trajectory.Usage) int64 {
	if u == nil {
		return 0
	}
	return u.TotalTokens
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func (p *Pool) observe(e Event) {
	if p.opts.Observe != nil {
		p.opts.Observe(e)
	}
}

// unparseable is an answer without a score on the scale (retried).
type unparseable struct{ err error }

func (u *unparseable) Error() string { return "the answer has " + u.err.Error() }
func (u *unparseable) Unwrap() error { return u.err }

// fatalError is a request the endpoint refused for good (a 4xx other than
// 408 and 429): not retried.
type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

// retryAfter is a 429 or 503 with the server's Retry-After.
type retryAfter struct {
	err   error
	after time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

func backoff(retry int, last error, base time.Duration) time.Duration {
	var ra *retryAfter
	if errors.As(last, &ra) && ra.after > 0 {
		return min(ra.after, 10*time.Second)
	}
	return base << min(retry-1, 4)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxResponseBytes caps a judge's response body.
const maxResponseBytes = 4 << 20

// ask sends one request to the judge, within its slot and its timeout.
func (p *Pool) ask(ctx context.Context, e *Endpoint, msgs []chatMessage) (Entry, error) {
	slots := p.slots(e)
	waitStart := time.Now()
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return Entry{}, fmt.Errorf("waiting for one of %s's %d slots: %w", e.BaseURL, cap(slots), ctx.Err())
	}
	defer func() { <-slots }()
	wait := time.Since(waitStart)
	body := map[string]any{"model": e.Model, "messages": msgs, "max_tokens": e.maxTokens()}
	if e.Temperature != nil {
		body["temperature"] = *e.Temperature
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(e.BaseURL, "/")+"/chat/completions", bytes.NewReader(b))
	if err != nil {
		return Entry{}, &fatalError{err}
	}
	req.Header.Set("Content-Type", "application/json")
	if e.APIKeyEnv != "" && p.opts.APIKey != nil {
		if k := p.opts.APIKey(e.APIKeyEnv); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	start := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			return Entry{}, fmt.Errorf("no answer within the judge's timeout of %s", e.timeout())
		}
		return Entry{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	lat := time.Since(start)
	if err != nil {
		return Entry{}, fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(data))
		switch {
		case resp.StatusCode == 429 || resp.StatusCode == 503:
			ra := &retryAfter{err: err}
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
				ra.after = time.Duration(s) * time.Second
			}
			return Entry{}, ra
		case resp.StatusCode >= 500 || resp.StatusCode == 408:
			return Entry{}, err
		}
		return Entry{}, &fatalError{err}
	}
	if len(data) > maxResponseBytes {
		return Entry{}, fmt.Errorf("the answer is over %d bytes", maxResponseBytes)
	}
	var cr struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content json.RawMessage `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
			TotalTokens      int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &cr); err != nil || len(cr.Choices) == 0 {
		return Entry{}, fmt.Errorf("not a chat completion: %s", snippet(data))
	}
	ent := Entry{Text: contentText(cr.Choices[0].Message.Content), Model: cr.Model, LatencyMS: float64(lat) / float64(time.Millisecond), wait: wait}
	if cr.Usage != nil {
		ent.Usage = &trajectory.Usage{PromptTokens: cr.Usage.PromptTokens, CompletionTokens: cr.Usage.CompletionTokens, TotalTokens: cr.Usage.TotalTokens}
	}
	return ent, nil
}

// contentText reads a message's content: a string, or text parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func snippet(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return strings.TrimSpace(s)
}

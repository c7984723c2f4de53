// Package fakejudge is an OpenAI-compatible chat-completions server that
// plays a judge deterministically, for tests, benchmarks and demos: it
// answers well-formed JSON, free text with a score, garbage, HTTP errors or
// slowly, as its Behavior says, and counts what it was asked (requests,
// the most in flight at once).
package fakejudge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Request is what the judge was asked: the rubric's name and scale as the
// prompt states them, and the whole prompt.
type Request struct {
	Model  string
	Rubric string
	// Min and Max are the numeric scale ([0, 0] for a labelled one).
	Min, Max float64
	// Labels are a labelled scale's labels.
	Labels []string
	// Prompt is the user message (the rubric and the episode's views).
	Prompt string
	// N counts the server's requests from 1.
	N int64
}

// Reply is the server's answer: Status (200 when 0) and the message
// content (or, for an error status, the body). Delay is waited first.
type Reply struct {
	Status int
	Text   string
	Delay  time.Duration
}

// Behavior answers a request.
type Behavior func(Request) Reply

// Scorer gives a request's score on its scale (clamped to it).
type Scorer func(Request) float64

// JSON answers {"score": S, "reason": ...} with S from score.
func JSON(score Scorer) Behavior {
	return func(r Request) Reply {
		s := clamp(r, score(r))
		b, _ := json.Marshal(map[string]any{"score": s, "reason": fmt.Sprintf("%s scored by %s", r.Rubric, r.Model)})
		return Reply{Text: string(b)}
	}
}

// Text answers prose ending "Score: S/MAX".
func Text(score Scorer) Behavior {
	return func(r Request) Reply {
		s := clamp(r, score(r))
		return Reply{Text: fmt.Sprintf("I read the episode carefully for %s.\nReason: judged by %s.\nScore: %s/%s", r.Rubric, r.Model, num(s), num(r.Max))}
	}
}

// Garbage answers text with no score in it.
func Garbage() Behavior {
	return func(Request) Reply {
		return Reply{Text: "As an AI language model I would rather not grade this. {unbalanced"}
	}
}

// Status answers an HTTP error.
func Status(code int) Behavior {
	return func(Request) Reply { return Reply{Status: code, Text: `{"error": {"message": "fake failure"}}`} }
}

// Slow answers as b does after d.
func Slow(d time.Duration, b Behavior) Behavior {
	return func(r Request) Reply {
		rep := b(r)
		rep.Delay += d
		return rep
	}
}

// FailFirst answers as fail for the first n requests, then as b.
func FailFirst(n int64, fail, b Behavior) Behavior {
	return func(r Request) Reply {
		if r.N <= n {
			return fail(r)
		}
		return b(r)
	}
}

// Fixed scores every request v.
func Fixed(v float64) Scorer { return func(Request) float64 { return v } }

// ByRubric scores each rubric by name (others: the scale's middle).
func ByRubric(scores map[string]float64) Scorer {
	return func(r Request) float64 {
		if v, ok := scores[r.Rubric]; ok {
			return v
		}
		return (r.Min + r.Max) / 2
	}
}

// Hashed scores a request by a hash of its model, rubric and prompt: the
// same question always gets the same score, different ones spread over
// the scale.
func Hashed() Scorer {
	return func(r Request) float64 {
		h := fnv.New64a()
		h.Write([]byte(r.Model + "\x00" + r.Rubric + "\x00" + r.Prompt))
		steps := r.Max - r.Min
		return r.Min + float64(h.Sum64()%uint64(steps+1))
	}
}

// Contains scores yes when the prompt contains marker, else no.
func Contains(marker string, yes, no float64) Scorer {
	return func(r Request) float64 {
		if strings.Contains(r.Prompt, marker) {
			return yes
		}
		return no
	}
}

func clamp(r Request, v float64) float64 {
	if r.Max > r.Min {
		return max(r.Min, min(r.Max, v))
	}
	return v
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// Config configures a Server.
type Config struct {
	// Addr to listen on ("127.0.0.1:0" when empty).
	Addr string
	// Model is reported in answers ("fake-judge" when empty).
	Model string
	// Behavior answers (JSON(Hashed()) when nil).
	Behavior Behavior
}

// Server is a running fake judge.
type Server struct {
	cfg      Config
	srv      *http.Server
	ln       net.Listener
	requests atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64
	tokens   atomic.Int64

	mu      sync.Mutex
	prompts []Request
}

// Start listens and serves until Close.
func Start(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Model == "" {
		cfg.Model = "fake-judge"
	}
	if cfg.Behavior == nil {
		cfg.Behavior = JSON(Hashed())
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fakejudge: listen on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// URL is the API root (http://HOST:PORT/v1).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Requests counts the requests received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// PeakInflight is the most requests in flight at once.
func (s *Server) PeakInflight() int64 { return s.peak.Load() }

// Asked returns the requests received, in order.
func (s *Server) Asked() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.prompts...)
}

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return s.srv.Close()
	}
	return err
}

var (
	rubricRe = regexp.MustCompile(`(?m)^Rubric: (.+)$`)
	rangeRe  = regexp.MustCompile(`a number from ([-\d.]+) \(worst\) to ([-\d.]+) \(best\)`)
	labelRe  = regexp.MustCompile(`"([^"]+)" \(`)
)

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	n := s.requests.Add(1)
	cur := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for {
		p := s.peak.Load()
		if cur <= p || s.peak.CompareAndSwap(p, cur) {
			break
		}
	}
	var body struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error": {"message": "bad JSON"}}`, http.StatusBadRequest)
		return
	}
	req := Request{Model: body.Model, N: n}
	for _, m := range body.Messages {
		if m.Role == "user" {
			req.Prompt = m.Content
		}
	}
	if m := rubricRe.FindStringSubmatch(req.Prompt); m != nil {
		req.Rubric = strings.TrimSpace(m[1])
	}
	if m := rangeRe.FindStringSubmatch(req.Prompt); m != nil {
		req.Min, _ = strconv.ParseFloat(m[1], 64)
		req.Max, _ = strconv.ParseFloat(m[2], 64)
	} else if i := strings.Index(req.Prompt, "one of the labels "); i >= 0 {
		line := req.Prompt[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		for _, m := range labelRe.FindAllStringSubmatch(line, -1) {
			req.Labels = append(req.Labels, m[1])
		}
	}
	s.mu.Lock()
	s.prompts = append(s.prompts, req)
	s.mu.Unlock()
	rep := s.cfg.Behavior(req)
	if rep.Delay > 0 {
		select {
		case <-time.After(rep.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.Status)
		w.Write([]byte(rep.Text))
		return
	}
	prompt := int64(len(req.Prompt) / 4)
	completion := int64(len(rep.Text)/4 + 1)
	s.tokens.Add(prompt + completion)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("judge-%d", n), "object": "chat.completion", "model": s.cfg.Model,
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": rep.Text}}},
		"usage": map[string]int64{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
	})
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/replay"
	"github.com/rollbox/rollbox/agent/scripted"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// policyOptions tune a network policy.
type policyOptions struct {
	retries int
	timeout time.Duration
	// apiKey is sent to an OpenAI-compatible server ($OPENAI_API_KEY).
	apiKey string
}

// openPolicy parses --policy.
func openPolicy(spec string, tasks []*agent.Task, opts policyOptions) (agent.Policy, trajectory.Policy, error) {
	kind, rest, ok := strings.Cut(spec, ":")
	if !ok || rest == "" {
		return nil, trajectory.Policy{}, fmt.Errorf("%q: want scripted:FILE.jsonl, openai:BASE_URL[#model=NAME[&mode=tokens]] or replay:DIR", spec)
	}
	switch kind {
	case "replay":
		p, err := replay.Load(rest)
		if err != nil {
			return nil, trajectory.Policy{}, err
		}
		return p, trajectory.Policy{Kind: "replay", Endpoint: rest}, nil
	case "scripted":
		return openScripted(rest, tasks)
	case "openai":
		base, frag, _ := strings.Cut(rest, "#")
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, trajectory.Policy{}, fmt.Errorf("openai: %q is not an http(s) URL", base)
		}
		q, err := url.ParseQuery(frag)
		if err != nil {
			return nil, trajectory.Policy{}, fmt.Errorf("openai: fragment %q: %v (want #model=NAME)", frag, err)
		}
		for k := range q {
			if k != "model" && k != "mode" && k != "tokenize_url" {
				return nil, trajectory.Policy{}, fmt.Errorf("openai: unknown option %q in #%s (known: model, mode, tokenize_url)", k, frag)
			}
		}
		switch q.Get("mode") {
		case "", trajectory.ModeChat:
			if q.Has("tokenize_url") {
				return nil, trajectory.Policy{}, fmt.Errorf("openai: tokenize_url is only for mode=tokens")
			}
		case trajectory.ModeTokens:
			return openTokens(base, q.Get("model"), q.Get("tokenize_url"), opts)
		default:
			return nil, trajectory.Policy{}, fmt.Errorf("openai: mode %q in #%s is not one of chat, tokens", q.Get("mode"), frag)
		}
		return openOpenAI(base, q.Get("model"), opts)
	}
	return nil, trajectory.Policy{}, fmt.Errorf("policy kind %q is not one of scripted, openai, replay", kind)
}

// openOpenAI makes an OpenAI-compatible policy. Without a model name it
// asks the server's /models and takes the only (or first) model served.
func openOpenAI(base, model string, opts policyOptions) (agent.Policy, trajectory.Policy, error) {
	if model == "" {
		m, err := firstModel(base)
		if err != nil {
			return nil, trajectory.Policy{}, fmt.Errorf("openai: no #model=NAME given and %v", err)
		}
		model = m
	}
	p, err := openai.New(openai.Config{BaseURL: base, Model: model, APIKey: opts.apiKey, MaxRetries: opts.retries, Timeout: opts.timeout, BackoffBase: 200 * time.Millisecond})
	if err != nil {
		return nil, trajectory.Policy{}, err
	}
	return p, trajectory.Policy{Kind: "openai", Endpoint: base, Model: model}, nil
}

// openTokens makes a token-mode policy (openai:URL#model=NAME&mode=tokens):
// the server's tokenizer endpoint is probed now, so a server without one
// is refused before anything starts.
func openTokens(base, model, tokenizeURL string, opts policyOptions) (agent.Policy, trajectory.Policy, error) {
	if model == "" {
		m, err := firstModel(base)
		if err != nil {
			return nil, trajectory.Policy{}, fmt.Errorf("openai: no #model=NAME given and %v", err)
		}
		model = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := openai.NewTokens(ctx, openai.Config{BaseURL: base, Model: model, APIKey: opts.apiKey, MaxRetries: opts.retries,
		Timeout: opts.timeout, BackoffBase: 200 * time.Millisecond, TokenizeURL: tokenizeURL})
	if err != nil {
		return nil, trajectory.Policy{}, err
	}
	tok := p.Tokenizer()
	return p, trajectory.Policy{Kind: "openai", Endpoint: base, Model: model, Mode: trajectory.ModeTokens, Tokenizer: &tok}, nil
}

func firstModel(base string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(strings.TrimRight(base, "/") + "/models")
	if err != nil {
		return "", fmt.Errorf("the server's model list could not be read: %v", err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/models answered %s", base, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("GET %s/models listed no model", base)
	}
	return list.Data[0].ID, nil
}

// openScripted loads a scripted policy and checks it covers the tasks.
func openScripted(file string, tasks []*agent.Task) (agent.Policy, trajectory.Policy, error) {
	p, err := scripted.Load(file)
	if err != nil {
		return nil, trajectory.Policy{}, err
	}
	for _, t := range tasks {
		if !p.Has(t.ID) {
			return nil, trajectory.Policy{}, fmt.Errorf("scripted: %s has no script for task %q", file, t.ID)
		}
	}
	return p, trajectory.Policy{Kind: "scripted", Endpoint: file}, nil
}

// subagentPolicies opens the frozen sub-agent policies the tasks'
// orchestrators name, each once, before anything runs: a policy string
// (scripted:FILE, whose relative FILE resolves against the task file's
// directory, or openai:URL#model=NAME) or a policy object {"base_url",
// "model"}. It returns the resolver for runtime.BatchConfig.SubagentPolicy
// (nil when no task has an orchestrator).
func subagentPolicies(tasks []*agent.Task, opts policyOptions) (func(*agent.Task) (agent.Policy, trajectory.Policy, error), error) {
	type opened struct {
		p    agent.Policy
		info trajectory.Policy
	}
	bySpec := map[string]opened{}
	byTask := map[*agent.Task]opened{}
	for _, t := range tasks {
		o := t.Orchestrator
		if o == nil {
			continue
		}
		spec := o.PolicyString()
		if spec == "" {
			var obj struct {
				BaseURL string `json:"base_url"`
				Model   string `json:"model"`
			}
			dec := json.NewDecoder(strings.NewReader(string(o.SubagentPolicy)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&obj); err != nil || obj.BaseURL == "" {
				return nil, fmt.Errorf("task %q: orchestrator.subagent_policy: want a policy string or {\"base_url\", \"model\"}", t.ID)
			}
			spec = "openai:" + obj.BaseURL
			if obj.Model != "" {
				spec += "#model=" + url.QueryEscape(obj.Model)
			}
		}
		if file, ok := strings.CutPrefix(spec, "scripted:"); ok && !filepath.IsAbs(file) && t.Dir() != "" {
			spec = "scripted:" + filepath.Join(t.Dir(), file)
		}
		op, ok := bySpec[spec]
		if !ok {
			var err error
			if strings.HasPrefix(spec, "scripted:") {
				// A sub-agent script is picked by sub-task prompt: no task
				// id to check it covers.
				op.p, op.info, err = openScripted(strings.TrimPrefix(spec, "scripted:"), nil)
			} else {
				op.p, op.info, err = openPolicy(spec, nil, opts)
			}
			if err != nil {
				return nil, fmt.Errorf("task %q: orchestrator.subagent_policy: %v", t.ID, err)
			}
			bySpec[spec] = op
		}
		byTask[t] = op
	}
	if len(byTask) == 0 {
		return nil, nil
	}
	return func(t *agent.Task) (agent.Policy, trajectory.Policy, error) {
		op, ok := byTask[t]
		if !ok {
			return nil, trajectory.Policy{}, fmt.Errorf("task %q: no sub-agent policy was opened for it", t.ID)
		}
		return op.p, op.info, nil
	}, nil
}

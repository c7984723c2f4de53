package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// subagentPolicy is an orchestrator task's frozen sub-agent policy as the
// service runs it: an OpenAI-compatible client behind its endpoint's cap on
// calls in flight, in chat or token mode (its ids recorded, every one with
// loss mask 0: a sub-agent's turns are never trained on).
type subagentPolicy struct {
	policy agent.Policy
	info   trajectory.Policy
}

// subagentPolicies opens the sub-agent policies of the tasks' orchestrators
// (by task). The service takes a policy object only ({"base_url", "model",
// "sampling"?, "max_retries"?, "timeout_s"?}): a policy string names files
// of the machine it runs on, which is `rollbox run`'s, not a client's.
// field names the tasks in errors ("tasks"). A token-mode policy's
// tokenizer is probed here, at admission (see tokenPolicy).
func (s *Server) subagentPolicies(ctx context.Context, tasks []*agent.Task, field string) (map[*agent.Task]subagentPolicy, error) {
	out := map[*agent.Task]subagentPolicy{}
	for i, t := range tasks {
		o := t.Orchestrator
		if o == nil {
			continue
		}
		f := fmt.Sprintf("%s[%d].orchestrator.subagent_policy", field, i)
		if field == "task" {
			f = "task.orchestrator.subagent_policy"
		}
		if o.PolicyString() != "" {
			return nil, badField(f, "the service takes a policy object {\"base_url\": URL, \"model\": NAME}; policy strings (%s) are for rollbox run's task files", o.PolicyString())
		}
		var pr PolicyRequest
		if err := decodeStrict(o.SubagentPolicy, &pr, f); err != nil {
			return nil, err
		}
		if u, err := url.Parse(pr.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, badField(f+".base_url", "%q is not an http or https URL", pr.BaseURL)
		}
		if pr.Model == "" {
			return nil, badField(f+".model", "required: the frozen sub-agent model's name")
		}
		switch pr.Mode {
		case "", trajectory.ModeChat, trajectory.ModeTokens:
		default:
			return nil, badField(f+".mode", "%q is not one of chat, tokens", pr.Mode)
		}
		if pr.TokenizeURL != "" && pr.Mode != trajectory.ModeTokens {
			return nil, badField(f+".tokenize_url", "only with \"mode\": \"tokens\"")
		}
		if pr.MaxRetries != nil && (*pr.MaxRetries < 0 || *pr.MaxRetries > 20) {
			return nil, badField(f+".max_retries", "%d is outside 0..20", *pr.MaxRetries)
		}
		if pr.TimeoutS < 0 || pr.TimeoutS > s.maxima.PolicyTimeoutS {
			return nil, badField(f+".timeout_s", "%v is outside 0..%v", pr.TimeoutS, s.maxima.PolicyTimeoutS)
		}
		var sampling agent.Sampling
		if len(pr.Sampling) > 0 {
			if err := decodeStrict(pr.Sampling, &sampling, f+".sampling"); err != nil {
				return nil, err
			}
		}
		if err := agent.CheckJudges(t, trajectory.Policy{Endpoint: pr.BaseURL, Model: pr.Model}); err != nil {
			return nil, taskError(fmt.Errorf("the sub-agent policy: %w", err), fmt.Sprintf("%s[%d]", field, i))
		}
		ep := s.endpoints.get(pr.BaseURL)
		cfg, info := subagentConfig(pr, sampling, s.opts.PolicyAPIKey, ep)
		var p agent.Policy
		if pr.Mode == trajectory.ModeTokens {
			tp, err := s.tokenPolicy(ctx, cfg, f)
			if err != nil {
				return nil, err
			}
			tok := tp.Tokenizer()
			p, info.Mode, info.Tokenizer = tp, trajectory.ModeTokens, &tok
		} else {
			cp, err := openai.New(cfg)
			if err != nil {
				return nil, badField(f, "%v", err)
			}
			p = cp
		}
		out[t] = subagentPolicy{
			policy: &sampledPolicy{inner: &gatedPolicy{inner: p, ep: ep, metrics: s.metrics}, sampling: sampling},
			info:   info,
		}
	}
	return out, nil
}

// subagentConfig is the client configuration of a frozen sub-agent policy
// (its sampling decoded) on endpoint ep, and how its record names it.
func subagentConfig(pr PolicyRequest, sampling agent.Sampling, apiKey string, ep *endpoint) (openai.Config, trajectory.Policy) {
	retries := openai.DefaultMaxRetries
	if pr.MaxRetries != nil {
		retries = *pr.MaxRetries
		if retries == 0 {
			retries = -1
		}
	}
	cfg := openai.Config{BaseURL: pr.BaseURL, Model: pr.Model, APIKey: apiKey, MaxRetries: retries,
		Timeout: time.Duration(pr.TimeoutS * float64(time.Second)), HTTPClient: ep.client, TokenizeURL: pr.TokenizeURL}
	sj, _ := json.Marshal(sampling)
	return cfg, trajectory.Policy{Kind: "openai", Endpoint: pr.BaseURL, Model: strings.TrimSpace(pr.Model), Sampling: sj}
}

// subagents is how a service episode of task t runs its sub-agents.
func (s *Server) subagents(t *agent.Task, policies map[*agent.Task]subagentPolicy) *agent.Subagents {
	if t.Orchestrator == nil {
		return nil
	}
	sp, ok := policies[t]
	return &agent.Subagents{
		Policy: func(*agent.Task) (agent.Policy, trajectory.Policy, error) {
			if !ok {
				return nil, trajectory.Policy{}, fmt.Errorf("task %q: its sub-agent policy was not opened", t.ID)
			}
			return sp.policy, sp.info, nil
		},
		Slots: s.sched,
	}
}

// sampledPolicy sends the sub-agent policy's own sampling parameters in
// place of the episode's.
type sampledPolicy struct {
	inner    agent.Policy
	sampling agent.Sampling
}

func (p *sampledPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	req.Sampling = p.sampling
	return p.inner.Next(ctx, req)
}

package runtime

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/internal/cpugate"
)

// endpoint is one policy server (by base URL): a connection pool and a cap
// on calls in flight shared by every rollout that uses it, so thousands of
// episodes keep it busy without opening thousands of connections.
type endpoint struct {
	url    string
	sem    chan struct{}
	client *http.Client
}

type endpoints struct {
	limit int
	mu    sync.Mutex
	m     map[string]*endpoint
}

func (e *endpoints) get(url string) *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ep := e.m[url]; ep != nil {
		return ep
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = e.limit
	tr.MaxConnsPerHost = e.limit
	ep := &endpoint{url: url, sem: make(chan struct{}, e.limit), client: &http.Client{Transport: leaveGate{tr}}}
	e.m[url] = ep
	return ep
}

// leaveGate gives the request's turn at the CPU gate back (callApart)
// before the round trip: the policy's answer is a wait.
type leaveGate struct{ inner *http.Transport }

func (t leaveGate) RoundTrip(req *http.Request) (*http.Response, error) {
	cpugate.HoldOf(req.Context()).Leave()
	return t.inner.RoundTrip(req)
}

// CloseIdleConnections is the transport's (http.Client.CloseIdleConnections).
func (t leaveGate) CloseIdleConnections() { t.inner.CloseIdleConnections() }

func (e *endpoints) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ep := range e.m {
		ep.client.CloseIdleConnections()
	}
}

func acquire(ctx context.Context, sem chan struct{}) error {
	if sem == nil {
		return nil
	}
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func release(sem chan struct{}) {
	if sem != nil {
		<-sem
	}
}

// gatedPolicy is one episode's view of its rollout's policy: each call
// waits for a slot of the rollout's cap and of the endpoint's, and is
// measured.
type gatedPolicy struct {
	inner      agent.Policy
	ep         *endpoint
	rolloutSem chan struct{}
	metrics    *Metrics
	// versions, when set, gives each turn the rollout's policy version and
	// ends a stale episode (max_staleness).
	versions versioner
	// cpu, when set, is the CPU gate the call's request is built and
	// encoded behind (callApart).
	cpu *cpugate.Gate
}

func (g *gatedPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	start := time.Now()
	if err := acquire(ctx, g.rolloutSem); err != nil {
		return agent.Turn{}, err
	}
	defer release(g.rolloutSem)
	if err := acquire(ctx, g.ep.sem); err != nil {
		return agent.Turn{}, err
	}
	defer release(g.ep.sem)
	g.metrics.PolicyWait.WithLabelValues(g.ep.url).Observe(seconds(time.Since(start)))
	inflight := g.metrics.PolicyInflight.WithLabelValues(g.ep.url)
	inflight.Inc()
	defer inflight.Dec()
	var version string
	if g.versions != nil {
		v, err := g.versions.versionFor()
		if err != nil {
			return agent.Turn{}, err
		}
		version = v
	}
	t0 := time.Now()
	turn, gateWait, err := callApart(ctx, g.inner, req, g.cpu)
	turn.PolicyVersion = version
	// The wait for a turn at the CPU gate is the service's, not the policy's.
	g.metrics.PolicyDuration.WithLabelValues(g.ep.url).Observe(seconds(time.Since(t0) - gateWait))
	if err != nil && ctx.Err() == nil {
		g.metrics.PolicyErrors.WithLabelValues(g.ep.url).Inc()
	}
	return turn, err
}

// callApart makes the policy call on a goroutine of its own and waits for
// it. Encoding a request (openai-go's nested MarshalJSON over the whole
// conversation) and decoding its answer take tens of KB of stack: made on
// the episode's goroutine, they grow its stack to 32-64 KB for the rest of
// the episode (Go halves a stack only when a GC finds it three quarters
// unused, and the next turn grows it again), and with 5,000 episodes
// running their stacks were 329 MB of a 920 MB peak, the heap's goal
// counting them once more. Apart, only the calls in flight (at most
// --policy-concurrency) hold such a stack, and only while they run. A
// panic of the call is raised again on the caller's goroutine, where the
// episode recovers it as before.
//
// With a CPU gate, the call builds and encodes its request (the most CPU
// an episode's turn takes) with a turn at the gate, given back when the
// request goes out (leaveGate): the wait for the turn comes before the
// policy's latency is measured, and the answer's decoding is not gated.
// gateWait is how long the call waited for its turn.
func callApart(ctx context.Context, p agent.Policy, req agent.Request, cpu *cpugate.Gate) (turn agent.Turn, gateWait time.Duration, err error) {
	type result struct {
		turn   agent.Turn
		err    error
		panic  any
		waited time.Duration
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panic = p
			}
			done <- r
		}()
		h := cpu.Hold()
		defer h.Leave()
		if h.Enter(ctx) {
			ctx = cpugate.WithHold(ctx, h)
		}
		r.turn, r.err = p.Next(ctx, req)
		r.waited = h.Waited()
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.turn, r.waited, r.err
}

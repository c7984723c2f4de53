package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
	"github.com/rollbox/rollbox/sandbox"
)

// WorkerOptions configure a cluster worker (`rollbox worker`).
type WorkerOptions struct {
	// URL is the NATS server (nats://HOST:PORT).
	URL string
	// ID names the worker (default: host-pid); Host is its host name.
	ID, Host string
	// Backend is the sandbox backend it runs; Backends opens it.
	Backend  string
	Backends BackendSource
	// Slots bounds the episodes it runs at once.
	Slots int
	// PolicyConcurrency bounds its policy calls in flight per endpoint
	// (default Slots).
	PolicyConcurrency int
	// DataDir receives the journals of the episodes it runs (each is
	// removed once the coordinator has stored the episode).
	DataDir string
	// Heartbeat is its heartbeat interval (default cluster.DefaultHeartbeat).
	Heartbeat time.Duration
	// PolicyAPIKey is sent to the policy servers.
	PolicyAPIKey string
	// WarmPool is the most ready sandboxes it keeps per spec (default 0).
	WarmPool int
	Logger   *slog.Logger
	// Registry receives its metrics (a new one when nil).
	Registry *prometheus.Registry
}

// worker runs the episodes a coordinator dispatches.
type worker struct {
	o         WorkerOptions
	log       *slog.Logger
	nc        *nats.Conn
	js        jetstream.JetStream
	backends  *backendOpener
	sandboxes *sandboxes
	endpoints *endpoints
	judges    *judge.Pool
	metrics   *Metrics
	free      chan struct{} // one token per free slot

	mu       sync.Mutex
	running  map[string]*attempt // by episode id
	policies map[string]agent.Policy
	stored   map[string]chan cluster.Stored // by episode id
}

// attempt is one episode run by the worker.
type attempt struct {
	item    cluster.WorkItem
	msg     jetstream.Msg
	number  int
	asked   atomic.Bool
	cancel  context.CancelCauseFunc
	seq     int
	seqMu   sync.Mutex
	subject string
}

// RunWorker runs a cluster worker until ctx ends: it pulls work items of
// its backend within its slots, claims each from the coordinator, runs it
// with the same engine as a single host, streams its journal back, and acks
// the item once the coordinator has stored the episode. When ctx ends it
// takes no more work and waits for what it runs.
func RunWorker(ctx context.Context, o WorkerOptions) error {
	if o.Slots <= 0 {
		return fmt.Errorf("--slots %d: want at least 1", o.Slots)
	}
	if err := sandbox.CheckBackend(o.Backend); err != nil {
		return fmt.Errorf("--backend: %w", err)
	}
	if o.DataDir == "" {
		return errors.New("runtime: WorkerOptions.DataDir is required")
	}
	if o.Host == "" {
		o.Host, _ = os.Hostname()
	}
	if o.ID == "" {
		o.ID = fmt.Sprintf("%s-%d", o.Host, os.Getpid())
	}
	if err := checkWorkerID(o.ID); err != nil {
		return err
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = cluster.DefaultHeartbeat
	}
	if o.PolicyConcurrency <= 0 {
		o.PolicyConcurrency = o.Slots
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return fmt.Errorf("worker data directory: %w", err)
	}
	nc, js, err := cluster.Connect(o.URL, "rollbox-worker-"+o.ID)
	if err != nil {
		return err
	}
	defer nc.Close()
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cluster.EnsureStreams(setup, js); err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(setup, cluster.WorkStream, cluster.WorkConsumerConfig(o.Backend))
	if err != nil {
		return fmt.Errorf("JetStream consumer %s: %w", cluster.WorkConsumer(o.Backend), err)
	}
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	w := &worker{o: o, log: o.Logger, nc: nc, js: js, metrics: NewMetrics(o.Registry), free: make(chan struct{}, o.Slots),
		running: map[string]*attempt{}, policies: map[string]agent.Policy{}, stored: map[string]chan cluster.Stored{}}
	for range o.Slots {
		w.free <- struct{}{}
	}
	w.backends = newBackendOpener(life, o.Backends, o.Logger)
	defer w.backends.Close()
	w.sandboxes = &sandboxes{backends: w.backends, metrics: w.metrics, warm: map[string]int{o.Backend: o.WarmPool}, pools: map[string]*sandbox.Pool{}}
	defer w.sandboxes.Close()
	w.endpoints = &endpoints{limit: o.PolicyConcurrency, m: map[string]*endpoint{}}
	defer w.endpoints.Close()
	w.judges = judge.NewPool(judge.Options{})
	sub, err := nc.Subscribe(cluster.StoredSubject(o.ID), w.onStored)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	csub, err := nc.Subscribe(cluster.CancelSubject, w.onCancel)
	if err != nil {
		return err
	}
	defer csub.Unsubscribe()
	psub, err := nc.Subscribe(cluster.PingSubject(o.ID), func(m *nats.Msg) { m.Respond(nil) })
	if err != nil {
		return err
	}
	defer psub.Unsubscribe()
	w.beat(false)
	go w.heartbeats(life)
	o.Logger.Info("worker started", "worker", o.ID, "backend", o.Backend, "slots", o.Slots, "cluster", o.URL)

	var wg sync.WaitGroup
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-w.free:
		}
		n := 1
	more:
		for n < o.Slots {
			select {
			case <-w.free:
				n++
			default:
				break more
			}
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
		got := 0
		if err == nil {
			for msg := range batch.Messages() {
				got++
				wg.Add(1)
				go func() {
					defer wg.Done()
					w.handle(life, msg)
					w.free <- struct{}{}
				}()
			}
			err = batch.Error()
		}
		for range n - got {
			w.free <- struct{}{}
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			w.log.Warn("worker: fetching work", "err", err)
			time.Sleep(250 * time.Millisecond)
		}
	}
	wg.Wait()
	w.beat(true)
	nc.Flush()
	return nil
}

// checkWorkerID wants a worker id that is one subject token.
func checkWorkerID(id string) error {
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("--id %q: use letters, digits, - and _ only", id)
		}
	}
	if id == "" {
		return errors.New("--id is empty")
	}
	return nil
}

// beat publishes a heartbeat.
func (w *worker) beat(leaving bool) {
	hb := cluster.Heartbeat{ID: w.o.ID, Host: w.o.Host, Backends: []string{w.o.Backend}, Slots: w.o.Slots, Interval: w.o.Heartbeat, Leaving: leaving}
	w.mu.Lock()
	for id, a := range w.running {
		hb.Episodes = append(hb.Episodes, cluster.Running{EpisodeID: id, Attempt: a.number, AckSubject: a.msg.Reply(), Asked: a.asked.Load()})
	}
	w.mu.Unlock()
	hb.Running = len(hb.Episodes)
	b, _ := json.Marshal(hb)
	w.nc.Publish(cluster.HeartbeatSubject(w.o.ID), b)
}

func (w *worker) heartbeats(ctx context.Context) {
	t := time.NewTicker(w.o.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.beat(false)
		}
	}
}

func (w *worker) onStored(m *nats.Msg) {
	var st cluster.Stored
	if json.Unmarshal(m.Data, &st) != nil {
		return
	}
	w.mu.Lock()
	ch := w.stored[st.EpisodeID]
	w.mu.Unlock()
	if ch != nil {
		select {
		case ch <- st:
		default:
		}
	}
}

func (w *worker) onCancel(m *nats.Msg) {
	var c cluster.Cancel
	if json.Unmarshal(m.Data, &c) != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.running {
		if a.item.RolloutID == c.RolloutID {
			a.cancel(&agent.StopCause{Reason: c.Reason, Message: c.Message})
		}
	}
}

// claim asks the coordinator whether msg's item may run, until it answers
// or ctx ends.
func (w *worker) claim(ctx context.Context, id string, msg jetstream.Msg) (cluster.ClaimReply, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return cluster.ClaimReply{}, err
	}
	body, _ := json.Marshal(cluster.Claim{EpisodeID: id, Worker: w.o.ID, Delivery: meta.NumDelivered, AckSubject: msg.Reply()})
	for {
		resp, err := w.nc.Request(cluster.ClaimSubject, body, 5*time.Second)
		if err == nil {
			var rep cluster.ClaimReply
			if err := json.Unmarshal(resp.Data, &rep); err != nil {
				return rep, fmt.Errorf("claim answer: %w", err)
			}
			return rep, nil
		}
		if ctx.Err() != nil {
			return cluster.ClaimReply{}, ctx.Err()
		}
		msg.InProgress()
		w.log.Warn("worker: no coordinator answers claims; retrying", "episode", id, "err", err)
		time.Sleep(500 * time.Millisecond)
	}
}

// handle claims, runs and reports one work item.
func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	var item cluster.WorkItem
	if err := json.Unmarshal(msg.Data(), &item); err != nil || item.EpisodeID == "" {
		w.log.Error("worker: a work item that is not one; dropped", "subject", msg.Subject(), "err", err)
		msg.Term()
		return
	}
	rep, err := w.claim(ctx, item.EpisodeID, msg)
	if err != nil {
		msg.Nak()
		return
	}
	switch rep.Decision {
	case cluster.DecisionRun:
	case cluster.DecisionWait:
		msg.NakWithDelay(time.Second)
		return
	default:
		msg.Ack()
		return
	}
	a := &attempt{item: item, msg: msg, number: rep.Attempt, subject: cluster.JournalSubject(item.EpisodeID)}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.cancel = cancel
	storedCh := make(chan cluster.Stored, 4)
	w.mu.Lock()
	w.running[item.EpisodeID] = a
	w.stored[item.EpisodeID] = storedCh
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.running, item.EpisodeID)
		delete(w.stored, item.EpisodeID)
		w.mu.Unlock()
	}()
	// Keep the item ours while it runs.
	keep, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	go func() {
		t := time.NewTicker(cluster.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-keep.Done():
				return
			case <-t.C:
				msg.InProgress()
			}
		}
	}()
	done := w.run(actx, a)
	body, _ := json.Marshal(done)
	for {
		a.seqMu.Lock()
		lines := a.seq
		a.seqMu.Unlock()
		if err := w.publish(ctx, a, cluster.KindDone, lines, body); err != nil {
			w.log.Error("worker: publishing an episode's end failed; the item is left for redelivery", "episode", item.EpisodeID, "err", err)
			return
		}
		select {
		case st := <-storedCh:
			if st.Attempt != a.number {
				continue
			}
			switch st.Action {
			case cluster.ActionAck:
				if err := msg.DoubleAck(ctx); err != nil {
					w.log.Warn("worker: acking a stored episode's item", "episode", item.EpisodeID, "err", err)
				}
				os.Remove(filepath.Join(w.o.DataDir, item.EpisodeID+".json"))
			case cluster.ActionRetry:
				msg.NakWithDelay(200 * time.Millisecond)
				os.Remove(filepath.Join(w.o.DataDir, item.EpisodeID+".json"))
			case cluster.ActionDrop:
				// The coordinator decided the episode without this attempt
				// (taken for lost): the item is no longer this worker's.
				os.Remove(filepath.Join(w.o.DataDir, item.EpisodeID+".json"))
			}
			return
		case <-time.After(5 * time.Second):
			// The coordinator may have restarted: say it again.
		}
	}
}

// run runs the episode of a claimed item; it returns the attempt's Done.
func (w *worker) run(ctx context.Context, a *attempt) cluster.Done {
	item := a.item
	task := &agent.Task{}
	if err := json.Unmarshal(item.Task, task); err != nil {
		return cluster.Done{Error: fmt.Sprintf("the work item's task: %v", err)}
	}
	pol, err := w.policy(item)
	if err != nil {
		return cluster.Done{Error: err.Error()}
	}
	pl := newPlan(task, item.Backend, w.sandboxes.warm)
	cfg := pl.config(item.RolloutID, item.GroupIndex, w.o.DataDir)
	if cfg.EpisodeID != item.EpisodeID {
		return cluster.Done{Error: fmt.Sprintf("the work item's episode id %q is not %q", item.EpisodeID, cfg.EpisodeID)}
	}
	cfg.NewSandbox = w.sandboxes.create
	ep := w.endpoints.get(item.Policy.BaseURL)
	var sem chan struct{}
	if item.Policy.MaxConcurrency > 0 {
		sem = make(chan struct{}, item.Policy.MaxConcurrency)
	}
	cfg.Policy = &askedPolicy{inner: &gatedPolicy{inner: pol, ep: ep, rolloutSem: sem, metrics: w.metrics}, a: a, w: w}
	cfg.PolicyInfo = item.Policy.Info
	if len(item.Policy.Sampling) > 0 {
		json.Unmarshal(item.Policy.Sampling, &cfg.Sampling)
	}
	cfg.Observe = w.metrics.observer(pl.backend)
	cfg.Judges = w.judges
	cfg.TrainStep = item.TrainStep
	cfg.Journal = func(line []byte) error { return w.publishLine(ctx, a, line) }
	w.backends.get(ctx, pl.backend)
	s, err := agent.Open(ctx, cfg)
	var oe *agent.OpenError
	switch {
	case errors.As(err, &oe):
		return cluster.Done{InfraFailure: oe.Infra(), Error: oe.Error()}
	case err != nil:
		return cluster.Done{Error: err.Error()}
	}
	if _, err := s.Drive(ctx, cfg.Policy); err != nil {
		return cluster.Done{Error: err.Error()}
	}
	return cluster.Done{}
}

// policy is the item's rollout's policy client (one per rollout).
func (w *worker) policy(item cluster.WorkItem) (agent.Policy, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.policies[item.RolloutID]; p != nil {
		return p, nil
	}
	pp := item.Policy
	ep := w.endpoints.get(pp.BaseURL)
	cfg := openai.Config{BaseURL: pp.BaseURL, Model: pp.Model, APIKey: w.o.PolicyAPIKey, MaxRetries: pp.MaxRetries,
		Timeout: time.Duration(pp.TimeoutS * float64(time.Second)), HTTPClient: ep.client, TokenizeURL: pp.TokenizeURL}
	var p agent.Policy
	if pp.Mode == trajectory.ModeTokens {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tp, err := openai.NewTokens(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("token-mode policy: %w", err)
		}
		p = tp
	} else {
		op, err := openai.New(cfg)
		if err != nil {
			return nil, err
		}
		p = op
	}
	w.policies[item.RolloutID] = p
	return p, nil
}

// publishLine streams one journal line.
func (w *worker) publishLine(ctx context.Context, a *attempt, line []byte) error {
	a.seqMu.Lock()
	defer a.seqMu.Unlock()
	if err := w.publish(ctx, a, cluster.KindLine, a.seq, line); err != nil {
		return err
	}
	a.seq++
	return nil
}

// publish sends one journal message and waits for JetStream's ack,
// retrying while NATS is away (up to two minutes).
func (w *worker) publish(ctx context.Context, a *attempt, kind string, seq int, body []byte) error {
	m := nats.NewMsg(a.subject)
	m.Data = body
	m.Header.Set(cluster.HeaderEpisode, a.item.EpisodeID)
	m.Header.Set(cluster.HeaderRollout, a.item.RolloutID)
	m.Header.Set(cluster.HeaderWorker, w.o.ID)
	m.Header.Set(cluster.HeaderAttempt, strconv.Itoa(a.number))
	m.Header.Set(cluster.HeaderKind, kind)
	if seq >= 0 {
		m.Header.Set(cluster.HeaderSeq, strconv.Itoa(seq))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := w.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("publish %s to %s: %w", kind, a.subject, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// askedPolicy tells the coordinator, durably, before an episode's first
// policy call: from then on a lost attempt is not re-run silently.
type askedPolicy struct {
	inner agent.Policy
	a     *attempt
	w     *worker
}

func (p *askedPolicy) Next(ctx context.Context, req agent.Request) (agent.Turn, error) {
	if !p.a.asked.Load() {
		if err := p.w.publish(ctx, p.a, cluster.KindAsked, -1, nil); err != nil {
			return agent.Turn{}, err
		}
		p.a.asked.Store(true)
	}
	return p.inner.Next(ctx, req)
}

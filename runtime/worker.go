package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	// AckWait is how long a work item it took stays its own without news
	// before JetStream redelivers it (default cluster.AckWait). It is the
	// ack wait of the backend's consumer, which every worker of that
	// backend shares: the worker sets it there only when no live worker of
	// the backend answers on cluster.AckWaitSubject, and RunWorker fails
	// with ErrAckWaitInUse when the live ones use another. Whatever set it,
	// the worker keeps its items with news every third of the consumer's
	// ack wait as the server holds it (read back every heartbeat).
	AckWait time.Duration
	// PolicyAPIKey is sent to the policy servers.
	PolicyAPIKey string
	// WarmPool is the most ready sandboxes it keeps per spec (default 0).
	WarmPool int
	Logger   *slog.Logger
	// Registry receives its metrics (a new one when nil).
	Registry *prometheus.Registry
	// Prepare, when set, runs once the worker has connected and found its
	// ID free (no live worker answers to it), before it takes work: the
	// command removes there what a killed predecessor of the same ID left.
	Prepare func(context.Context)
	// ConfigureEpisode, when set, adjusts each episode's config as
	// Options.ConfigureEpisode does on one host: a search task's tools over
	// its index, which must have the identity index (the work item's
	// Index, cluster.IndexIdentity). Its error fails the attempt as an
	// infrastructure failure (retried, possibly on another worker).
	ConfigureEpisode func(cfg *agent.Config, index string) error
	// RolloutIdle is how long the worker keeps a rollout's policy client
	// after the last of its episodes here ended (default one minute): a
	// rollout that has ended frees it.
	RolloutIdle time.Duration
}

// ErrWorkerIDTaken is RunWorker's error when a live worker answers to the
// ID it was given.
var ErrWorkerIDTaken = errors.New("worker id taken")

// ErrAckWaitInUse is RunWorker's error when the live workers of its
// backend keep their work items by another ack wait than its AckWait.
var ErrAckWaitInUse = errors.New("another ack wait is in use")

// DefaultRolloutIdle is WorkerOptions.RolloutIdle's default.
const DefaultRolloutIdle = time.Minute

// worker runs the episodes a coordinator dispatches.
type worker struct {
	o         WorkerOptions
	log       *slog.Logger
	nc        *nats.Conn
	ctl       *nats.Conn // heartbeats and pings
	js        jetstream.JetStream
	backends  *backendOpener
	sandboxes *sandboxes
	endpoints *endpoints
	judges    *judge.Pool
	metrics   *Metrics
	// episodesTotal counts the episodes that ended here by termination
	// reason; infraTotal the attempts that failed for the infrastructure's
	// sake before the policy was asked (retried by the coordinator).
	episodesTotal *prometheus.CounterVec
	infraTotal    prometheus.Counter
	free          chan struct{} // one token per free slot
	// reserving counts the group items taking their slots: the fetch loop
	// takes no work meanwhile.
	reserving atomic.Int32
	// tooSmallUntil (Unix ns): until then the worker fetches at the lowest
	// priority, having just left a group item too big for it (handleGroup).
	tooSmallUntil atomic.Int64
	groupMu       sync.Mutex // held by the group item reserving its slots

	// instance tells this process from another of the same ID (its
	// answers to pings carry it).
	instance string

	// ackWait is the ack wait of the backend's consumer the worker keeps
	// its items by (the server's, followed: followAckWait); ackChanged is
	// closed when it changes.
	ackMu      sync.Mutex
	ackWait    time.Duration
	ackChanged chan struct{}

	mu       sync.Mutex
	running  map[string]*attempt // by episode id
	rollouts map[string]*rolloutClient
	stored   map[string]chan cluster.Stored // by episode id
	// versions are the announced policy versions of the rollouts this
	// worker runs or has heard of lately (claims, VersionsSubject).
	versions map[string]*rolloutVersions
}

// rolloutVersions is a worker's copy of a rollout's announced policy
// versions, oldest first, and when it last heard of them.
type rolloutVersions struct {
	list  []string
	heard time.Time
}

// rolloutClient is what a worker holds of a rollout while it runs its
// episodes: the policy client and the rollout's cap on policy calls in
// flight. It is freed once no episode of the rollout has run here for
// WorkerOptions.RolloutIdle.
type rolloutClient struct {
	ready  chan struct{} // closed once policy (or err) is set
	policy agent.Policy
	err    error
	sem    chan struct{}
	refs   int       // episodes of the rollout running here (under worker.mu)
	idle   time.Time // when refs last dropped to 0
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
	// versionAt is 1 + the index of the version of the episode's first
	// turn in its rollout's versions, 0 before it (under worker.mu).
	versionAt int
	// prefix is the group's prefix the episode forks from (a group item
	// of a task with a prefix), else nil.
	prefix *agent.PrefixGroup
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
	if o.AckWait <= 0 {
		o.AckWait = cluster.AckWait
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
	if o.RolloutIdle <= 0 {
		o.RolloutIdle = DefaultRolloutIdle
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return fmt.Errorf("worker data directory: %w", err)
	}
	nc, js, err := cluster.Connect(o.URL, "rollbox-worker-"+o.ID)
	if err != nil {
		return err
	}
	defer nc.Close()
	// Heartbeats and pings have a connection of their own: they never
	// wait behind the journal's traffic.
	ctl, _, err := cluster.Connect(o.URL, "rollbox-worker-"+o.ID+"-control")
	if err != nil {
		return err
	}
	defer ctl.Close()
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cluster.EnsureStreams(setup, js); err != nil {
		return err
	}
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	w := &worker{o: o, log: o.Logger, nc: nc, ctl: ctl, js: js, metrics: NewMetrics(o.Registry), free: make(chan struct{}, o.Slots),
		running: map[string]*attempt{}, rollouts: map[string]*rolloutClient{}, stored: map[string]chan cluster.Stored{},
		versions: map[string]*rolloutVersions{}, ackChanged: make(chan struct{})}
	// One process per ID: a second worker started with the ID of a live
	// one would share its subjects (stored, ping) and its sandboxes'
	// owner label, and its gc would remove the live one's sandboxes.
	var nonce [8]byte
	rand.Read(nonce[:])
	w.instance = hex.EncodeToString(nonce[:])
	// The live workers of the backend are asked their ack wait while the
	// ID is taken: each waits for answers (worker start takes as long as
	// takeID alone).
	asub, err := w.answerAckWait()
	if err != nil {
		return err
	}
	defer asub.Unsubscribe()
	type answers struct {
		live []cluster.AckWaitAnswer
		err  error
	}
	asked := make(chan answers, 1)
	go func() {
		live, err := w.liveAckWaits(setup)
		asked <- answers{live, err}
	}()
	psub, err := w.takeID(setup)
	if err != nil {
		return err
	}
	defer psub.Unsubscribe()
	a := <-asked
	if a.err != nil {
		return a.err
	}
	cons, err := w.workQueue(setup, a.live)
	if err != nil {
		return err
	}
	if o.Prepare != nil {
		o.Prepare(ctx)
	}
	w.registerMetrics()
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
	vsub, err := nc.Subscribe(cluster.VersionsSubject, w.onVersions)
	if err != nil {
		return err
	}
	defer vsub.Unsubscribe()
	w.beat(false)
	go w.heartbeats(life)
	go w.followAckWait(life, cons)
	o.Logger.Info("worker started", "worker", o.ID, "backend", o.Backend, "slots", o.Slots, "cluster", o.URL, "ack_wait", w.ackWaitNow().String())

	var wg sync.WaitGroup
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-w.free:
		}
		if w.reserving.Load() > 0 {
			w.free <- struct{}{} // a group takes the slots that free up
			time.Sleep(20 * time.Millisecond)
			continue
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
		rank := n
		if time.Now().UnixNano() < w.tooSmallUntil.Load() {
			rank = 1 // the lowest priority
		}
		batch, err := cons.Fetch(n, append(cluster.WorkFetchOpts(rank), jetstream.FetchMaxWait(time.Second))...)
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
	ctl.Flush()
	nc.Flush()
	return nil
}

// registerMetrics registers the worker's own series in its registry
// (beside Metrics': sandboxes, tools, policy calls).
func (w *worker) registerMetrics() {
	count := func(f func() int) func() float64 {
		return func() float64 {
			w.mu.Lock()
			defer w.mu.Unlock()
			return float64(f())
		}
	}
	w.episodesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_worker_episodes_total",
		Help: "Episodes that ended on this worker, by termination reason (each stored by the coordinator with that end)."}, []string{"reason"})
	w.infraTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_worker_infra_failures_total",
		Help: "Attempts that failed here for the infrastructure's sake before the policy was asked (a sandbox that did not open, a search index missing or not the coordinator's); the coordinator retries them."})
	reconnects := func(conn string, nc *nats.Conn) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rollbox_worker_nats_reconnects_total",
			Help:        "Reconnections to the NATS server, by connection: work (work items, claims, journal) or control (heartbeats, pings).",
			ConstLabels: prometheus.Labels{"connection": conn}}, func() float64 { return float64(nc.Stats().Reconnects) })
	}
	w.o.Registry.MustRegister(w.episodesTotal, w.infraTotal, reconnects("work", w.nc), reconnects("control", w.ctl),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_worker_slots",
			Help: "Episodes the worker runs at once at most (--slots)."}, func() float64 { return float64(w.o.Slots) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_worker_running",
			Help: "Episodes the worker runs now."}, count(func() int { return len(w.running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_worker_rollout_clients",
			Help: "Rollouts whose policy client the worker holds (freed once none of their episodes has run here for the rollout idle time)."},
			count(func() int { return len(w.rollouts) })))
}

// pingAnswer is a worker's answer to a ping on its PingSubject.
type pingAnswer struct {
	Instance string `json:"instance"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
}

// takeID makes sure no live worker answers to w's ID, then answers to it
// itself (the ping subscription, returned), and asks again: of two
// workers started at once with one ID, the later one (or both) sees the
// other then, and refuses.
func (w *worker) takeID(ctx context.Context) (*nats.Subscription, error) {
	me, _ := json.Marshal(pingAnswer{Instance: w.instance, Host: w.o.Host, PID: os.Getpid()})
	if other, err := w.otherInstance(ctx); err != nil {
		return nil, err
	} else if other != nil {
		return nil, w.idTaken(other)
	}
	sub, err := w.ctl.Subscribe(cluster.PingSubject(w.o.ID), func(m *nats.Msg) { m.Respond(me) })
	if err != nil {
		return nil, err
	}
	if other, err := w.otherInstance(ctx); err != nil || other != nil {
		sub.Unsubscribe()
		if err != nil {
			return nil, err
		}
		return nil, w.idTaken(other)
	}
	return sub, nil
}

// ask publishes an empty request on subject and returns the channel its
// answers arrive on (up to buf held) and the function that stops them.
func (w *worker) ask(subject string, buf int) (<-chan *nats.Msg, func(), error) {
	inbox := w.ctl.NewRespInbox()
	ch := make(chan *nats.Msg, buf)
	sub, err := w.ctl.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, nil, err
	}
	if err := w.ctl.PublishRequest(subject, inbox, nil); err != nil {
		sub.Unsubscribe()
		return nil, nil, err
	}
	return ch, func() { sub.Unsubscribe() }, nil
}

// otherInstance pings w's ID and returns the first answer of another
// process, or nil when none answers within a second (a worker answers at
// once; with nobody subscribed NATS says so at once).
func (w *worker) otherInstance(ctx context.Context) (*pingAnswer, error) {
	ch, done, err := w.ask(cluster.PingSubject(w.o.ID), 16)
	if err != nil {
		return nil, err
	}
	defer done()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case m := <-ch:
			var a pingAnswer
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return nil, nil // no responders
			}
			json.Unmarshal(m.Data, &a)
			if a.Instance != w.instance {
				return &a, nil
			}
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (w *worker) idTaken(other *pingAnswer) error {
	who := "a live worker"
	if other.Host != "" {
		who = fmt.Sprintf("a live worker on host %s (pid %d)", other.Host, other.PID)
	}
	return fmt.Errorf("--id %s: %w: %s answers to it; stop that worker first or give this one another --id", w.o.ID, ErrWorkerIDTaken, who)
}

// answerAckWait makes w answer on cluster.AckWaitSubject with the ack
// wait it keeps its items by (its --ack-wait until workQueue read the
// consumer's back), before it asks the others (liveAckWaits): as in
// takeID, of two workers started at once with different values the later
// (or both) sees the other and is refused.
func (w *worker) answerAckWait() (*nats.Subscription, error) {
	w.setAckWait(w.o.AckWait)
	return w.ctl.Subscribe(cluster.AckWaitSubject(w.o.Backend), func(m *nats.Msg) {
		b, _ := json.Marshal(cluster.AckWaitAnswer{Worker: w.o.ID, Host: w.o.Host, Instance: w.instance, AckWait: w.ackWaitNow()})
		m.Respond(b)
	})
}

// workQueue joins the backend's work queue consumer, given the answers
// of the live workers of its backend (liveAckWaits). One of them keeping
// its items by another ack wait than o.AckWait refuses w
// (ErrAckWaitInUse): the consumer has one, and a shorter one would have
// JetStream redeliver the episodes they run while they run them. With
// none live, w sets its own on the consumer; with some, it leaves the
// consumer as it is. Either way w keeps its items by the ack wait the
// server holds, read back.
func (w *worker) workQueue(ctx context.Context, live []cluster.AckWaitAnswer) (jetstream.Consumer, error) {
	for _, a := range live {
		if a.AckWait != w.o.AckWait {
			return nil, w.ackWaitInUse(a, len(live))
		}
	}
	name := cluster.WorkConsumer(w.o.Backend)
	var (
		cons jetstream.Consumer
		err  error
	)
	if len(live) > 0 {
		cons, err = w.js.Consumer(ctx, cluster.WorkStream, name)
	}
	if len(live) == 0 || errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = w.js.CreateOrUpdateConsumer(ctx, cluster.WorkStream, cluster.WorkConsumerConfig(w.o.Backend, w.o.AckWait))
	}
	if err != nil {
		return nil, fmt.Errorf("JetStream consumer %s: %w", name, err)
	}
	if d := cons.CachedInfo().Config.AckWait; d != w.o.AckWait {
		w.log.Warn("worker: the work queue's ack wait on the NATS server is not --ack-wait; the worker keeps its items by the server's",
			"consumer", name, "ack_wait", d.String(), "flag", w.o.AckWait.String())
		w.setAckWait(d)
	}
	return cons, nil
}

// liveAckWaits asks the live workers of w's backend the ack wait they
// keep their items by and returns the answers of all but w itself
// (subscribed already: it answers at once), gathered until none came for
// a quarter of a second, two seconds at most.
func (w *worker) liveAckWaits(ctx context.Context) ([]cluster.AckWaitAnswer, error) {
	ch, done, err := w.ask(cluster.AckWaitSubject(w.o.Backend), 64)
	if err != nil {
		return nil, err
	}
	defer done()
	limit := time.NewTimer(2 * time.Second)
	defer limit.Stop()
	quiet := time.NewTimer(2 * time.Second)
	defer quiet.Stop()
	var out []cluster.AckWaitAnswer
	for {
		select {
		case m := <-ch:
			quiet.Reset(250 * time.Millisecond)
			var a cluster.AckWaitAnswer
			if json.Unmarshal(m.Data, &a) == nil && a.Instance != w.instance {
				out = append(out, a)
			}
		case <-quiet.C:
			return out, nil
		case <-limit.C:
			return out, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (w *worker) ackWaitInUse(a cluster.AckWaitAnswer, live int) error {
	return fmt.Errorf("--ack-wait %s: %w: the live workers of backend %s keep their work items by %s (%d live, among them %s on host %s); "+
		"the backend's work queue has one ack wait, which every worker of the backend keeps its items by (set to a shorter one, JetStream would redeliver "+
		"the episodes they run while they run them): start this worker with --ack-wait %s, or stop every worker of backend %s first to change it",
		w.o.AckWait, ErrAckWaitInUse, w.o.Backend, a.AckWait, live, a.Worker, a.Host, a.AckWait, w.o.Backend)
}

// ackWaitNow is the ack wait w keeps its items by.
func (w *worker) ackWaitNow() time.Duration {
	d, _ := w.ackWaitWatch()
	return d
}

// ackWaitWatch is the ack wait w keeps its items by and a channel closed
// when it changes.
func (w *worker) ackWaitWatch() (time.Duration, <-chan struct{}) {
	w.ackMu.Lock()
	defer w.ackMu.Unlock()
	return w.ackWait, w.ackChanged
}

func (w *worker) setAckWait(d time.Duration) {
	w.ackMu.Lock()
	defer w.ackMu.Unlock()
	if d != w.ackWait {
		w.ackWait = d
		close(w.ackChanged)
		w.ackChanged = make(chan struct{})
	}
}

// followAckWait reads the consumer's ack wait back from the server every
// heartbeat: changed there (by hand: a worker changes it only while no
// other is live), the items running here get news at once (keep), then
// every third of the new value.
func (w *worker) followAckWait(ctx context.Context, cons jetstream.Consumer) {
	t := time.NewTicker(w.o.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err != nil || info.Config.AckWait <= 0 {
			continue
		}
		if d, was := info.Config.AckWait, w.ackWaitNow(); d != was {
			w.log.Info("worker: the work queue's ack wait changed on the NATS server; items are kept by the new one",
				"consumer", info.Name, "ack_wait", d.String(), "was", was.String())
			w.setAckWait(d)
		}
	}
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
	w.ctl.Publish(cluster.HeartbeatSubject(w.o.ID), b)
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
			w.freeIdleRollouts(time.Now())
		}
	}
}

// freeIdleRollouts drops the clients of rollouts none of whose episodes
// has run here for RolloutIdle.
func (w *worker) freeIdleRollouts(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, rc := range w.rollouts {
		if rc.refs == 0 && now.Sub(rc.idle) >= w.o.RolloutIdle {
			delete(w.rollouts, id)
		}
	}
	for id, rv := range w.versions {
		if w.rollouts[id] == nil && now.Sub(rv.heard) >= w.o.RolloutIdle {
			delete(w.versions, id)
		}
	}
}

// noteVersionsLocked keeps the longer of the rollout's versions held and
// vs (versions are only ever appended).
func (w *worker) noteVersionsLocked(rolloutID string, vs []string, now time.Time) {
	rv := w.versions[rolloutID]
	if rv == nil {
		rv = &rolloutVersions{}
		w.versions[rolloutID] = rv
	}
	if len(vs) > len(rv.list) {
		rv.list = slices.Clone(vs)
	}
	rv.heard = now
}

// onVersions takes a rollout's versions after an announcement, cancels
// the episodes of it running here that are now stale and answers how
// many.
func (w *worker) onVersions(m *nats.Msg) {
	var v cluster.Versions
	if json.Unmarshal(m.Data, &v) != nil || v.RolloutID == "" {
		return
	}
	n := 0
	w.mu.Lock()
	w.noteVersionsLocked(v.RolloutID, v.Versions, time.Now())
	list := w.versions[v.RolloutID].list
	for _, a := range w.running {
		if a.item.RolloutID != v.RolloutID || a.versionAt == 0 {
			continue
		}
		if err := staleness(list, a.maxStaleness(), a.versionAt); err != nil {
			a.cancel(err)
			n++
		}
	}
	w.mu.Unlock()
	b, _ := json.Marshal(cluster.VersionsAck{Worker: w.o.ID, Cancelled: n})
	m.Respond(b)
}

// maxStaleness is the attempt's rollout's max_staleness (-1: none).
func (a *attempt) maxStaleness() int {
	if a.item.MaxStaleness == nil {
		return -1
	}
	return *a.item.MaxStaleness
}

// attemptVersions is a worker's versioner of an attempt: the rollout's
// versions as the worker holds them, the attempt's first pinned, a stale
// attempt cancelled, as rollout.versionFor on one host.
type attemptVersions struct {
	w *worker
	a *attempt
}

func (v attemptVersions) versionFor() (string, error) {
	w, a := v.w, v.a
	w.mu.Lock()
	defer w.mu.Unlock()
	var list []string
	if rv := w.versions[a.item.RolloutID]; rv != nil {
		list = rv.list
	}
	if err := staleness(list, a.maxStaleness(), a.versionAt); err != nil {
		a.cancel(err)
		return "", err
	}
	if len(list) == 0 {
		return "", nil
	}
	if a.versionAt == 0 {
		a.versionAt = len(list)
	}
	return list[len(list)-1], nil
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
	return w.claimOf(ctx, id, nil, msg)
}

// claimOf asks for episode id, or for a group item's members together.
func (w *worker) claimOf(ctx context.Context, id string, members []string, msg jetstream.Msg) (cluster.ClaimReply, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return cluster.ClaimReply{}, err
	}
	body, _ := json.Marshal(cluster.Claim{EpisodeID: id, Members: members, Worker: w.o.ID, Delivery: meta.NumDelivered, AckSubject: msg.Reply()})
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
	if err := json.Unmarshal(msg.Data(), &item); err != nil || item.EpisodeID == "" && len(item.Members) == 0 {
		w.log.Error("worker: a work item that is not one; dropped", "subject", msg.Subject(), "err", err)
		msg.Term()
		return
	}
	if len(item.Members) > 0 {
		w.handleGroup(ctx, msg, item)
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
	defer w.keep(ctx, msg)()
	switch w.attempt(ctx, msg, item, rep, nil) {
	case cluster.ActionAck:
		if err := msg.DoubleAck(ctx); err != nil {
			w.log.Warn("worker: acking a stored episode's item", "episode", item.EpisodeID, "err", err)
		}
	case cluster.ActionRetry:
		msg.NakWithDelay(200 * time.Millisecond)
	}
	// ActionDrop: the coordinator decided the episode without this attempt
	// (taken for lost): the item is no longer this worker's. "": the end
	// could not be published: the item is left for redelivery.
}

// keep keeps msg's item this worker's until the returned function is
// called: InProgress every third of the consumer's ack wait, and at once
// when the ack wait changed on the server (followAckWait).
func (w *worker) keep(ctx context.Context, msg jetstream.Msg) func() {
	keep, stop := context.WithCancel(ctx)
	go func() {
		for {
			d, changed := w.ackWaitWatch()
			t := time.NewTimer(d / 3)
			select {
			case <-keep.Done():
				t.Stop()
				return
			case <-t.C:
			case <-changed:
				t.Stop()
			}
			msg.InProgress()
		}
	}()
	return stop
}

// groupTooBigDelay (plus up to groupTooBigJitter) is how long a group
// item with more episodes than a worker's --slots waits before JetStream
// redelivers it, once the worker naked it.
const (
	groupTooBigDelay  = 1500 * time.Millisecond
	groupTooBigJitter = time.Second
)

// groupTooSmallFor is how long a worker that left a group item too big
// for it fetches at the lowest priority, so that the item's redelivery
// goes to a waiting worker of its rank with room before it.
const groupTooSmallFor = 10 * time.Second

// groupSlotWait is how long a worker waits for the slots of a group item
// before it leaves the item to a worker with room (or to itself later).
const groupSlotWait = 3 * time.Second

// handleGroup runs a group item: it takes a slot for each member (the
// fetch took one), claims each member, runs those to run together (a
// prefix task: the prefix once, each member in a fork of its sandbox),
// reports each as an episode of its own, and acks the item once every
// member is stored (naks it when one is to be retried).
func (w *worker) handleGroup(ctx context.Context, msg jetstream.Msg, item cluster.WorkItem) {
	n := len(item.Members)
	if n > w.o.Slots {
		w.log.Warn("worker: a group's work item needs a slot for each of its episodes, more than this worker's --slots; left to a worker with room",
			"group", item.GroupID, "episodes", n, "slots", w.o.Slots)
		// Ranked by free slots (cluster.WorkFetchOpts), the item goes next
		// to a waiting worker with more. Among workers of one rank (a
		// group of 3, this worker of 2 and one of 3) JetStream serves the
		// oldest request, and this worker's, made as it naked, was older
		// when the delay ended than the others' (renewed every second):
		// it got the item back each time (CI of de9b804: 20 times in 35 s,
		// the 3-slot worker never). So it fetches at the lowest priority
		// for a while.
		w.tooSmallUntil.Store(time.Now().Add(groupTooSmallFor).UnixNano())
		msg.NakWithDelay(groupTooBigDelay + mrand.N(groupTooBigJitter))
		return
	}
	// One group reserves its slots at a time, and the fetch loop takes no
	// work meanwhile; a group that finds another reserving leaves its item
	// at once, so that the slot its fetch took goes to that one (two groups
	// each holding part of the slots would wait on each other).
	if !w.groupMu.TryLock() {
		msg.NakWithDelay(250 * time.Millisecond)
		return
	}
	w.reserving.Add(1)
	held := 0
	defer func() {
		for range held {
			w.free <- struct{}{}
		}
	}()
	wait := time.NewTimer(groupSlotWait)
	for held < n-1 {
		select {
		case <-w.free:
			held++
			continue
		case <-wait.C:
			w.log.Info("worker: no room for a group's work item yet; left for redelivery", "group", item.GroupID, "episodes", n, "free", held+1)
			msg.NakWithDelay(250 * time.Millisecond)
		case <-ctx.Done():
			msg.Nak()
		}
		w.reserving.Add(-1)
		w.groupMu.Unlock()
		wait.Stop()
		return
	}
	w.reserving.Add(-1)
	w.groupMu.Unlock()
	wait.Stop()
	defer w.keep(ctx, msg)()
	type member struct {
		item cluster.WorkItem
		rep  cluster.ClaimReply
	}
	var runs []member
	ran := 0
	// The members are claimed together: the coordinator claims none when
	// one must wait, so a member never runs without the others nor has an
	// attempt counted that never ran.
	ids := make([]string, len(item.Members))
	for i, m := range item.Members {
		ids[i] = m.EpisodeID
	}
	grep, err := w.claimOf(ctx, "", ids, msg)
	switch {
	case err != nil:
		msg.Nak()
		return
	case grep.Decision == cluster.DecisionWait:
		msg.NakWithDelay(time.Second)
		return
	case grep.Decision != cluster.DecisionRun || len(grep.Members) != len(ids):
		w.log.Error("worker: a group's claim was not answered for each member; left for redelivery", "group", item.GroupID,
			"decision", grep.Decision, "reason", grep.Reason, "answers", len(grep.Members), "members", len(ids))
		msg.NakWithDelay(time.Second)
		return
	}
	for i, m := range item.Members {
		if rep := grep.Members[i]; rep.Decision == cluster.DecisionRun {
			mi := item
			mi.EpisodeID, mi.GroupIndex, mi.Members = m.EpisodeID, m.GroupIndex, nil
			runs = append(runs, member{mi, rep})
			ran = max(ran, rep.Attempt-1)
		}
	}
	if len(runs) == 0 {
		msg.DoubleAck(ctx) // every member has ended
		return
	}
	g := &groupRun{item: item, sent: map[string]bool{}}
	task := &agent.Task{}
	if json.Unmarshal(item.Task, task) == nil && task.Prefix != nil {
		// Runs are numbered by attempt: a group run again after a lost
		// attempt names its prefix <group>.prefix.N, as one host does.
		g.prefix = &agent.PrefixGroup{Name: item.GroupID, Size: len(runs), Dir: filepath.Join(w.o.DataDir, "prefixes"), Ran: ran}
	}
	actions := make([]string, len(runs))
	var wg sync.WaitGroup
	for i, m := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actions[i] = w.attempt(ctx, msg, m.item, m.rep, g)
		}()
	}
	wg.Wait()
	if g.prefix != nil {
		g.prefix.Close()
		w.sendPrefixes(ctx, g)
	}
	ack := true
	for _, a := range actions {
		switch a {
		case cluster.ActionAck:
		case cluster.ActionRetry:
			ack = false
		default:
			return // dropped (taken for lost) or its end not published: not this worker's to settle
		}
	}
	if !ack {
		msg.NakWithDelay(200 * time.Millisecond) // the members to retry run again; the stored ones are skipped
		return
	}
	if err := msg.DoubleAck(ctx); err != nil {
		w.log.Warn("worker: acking a stored group's item", "group", item.GroupID, "err", err)
	}
}

// groupRun is a group item being run: its prefix (nil for none) and the
// prefix records sent to the coordinator.
type groupRun struct {
	item   cluster.WorkItem
	prefix *agent.PrefixGroup
	mu     sync.Mutex
	sent   map[string]bool
}

// sendPrefixes publishes the group's prefix records that have ended and
// were not sent yet (KindPrefix): the coordinator keeps them under
// DATA/prefixes. Each is removed here once JetStream has it.
func (w *worker) sendPrefixes(ctx context.Context, g *groupRun) {
	g.mu.Lock()
	defer g.mu.Unlock()
	dir := filepath.Join(w.o.DataDir, "prefixes")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !strings.HasPrefix(id, g.item.GroupID+".prefix") || g.sent[id] {
			continue
		}
		doc, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		pa := &attempt{item: cluster.WorkItem{EpisodeID: id, RolloutID: g.item.RolloutID}, subject: cluster.JournalSubject(id)}
		if err := w.publish(ctx, pa, cluster.KindPrefix, -1, bytes.TrimSuffix(doc, []byte{'\n'})); err != nil {
			w.log.Warn("worker: sending a prefix's record", "prefix", id, "err", err)
			continue
		}
		g.sent[id] = true
		os.Remove(filepath.Join(dir, name))
	}
}

// sendSubagents publishes the records of the sub-agents an orchestrator
// attempt ran (KindSubagent), for the coordinator to keep beside the
// episode's record; each is removed here once JetStream has it.
func (w *worker) sendSubagents(ctx context.Context, a *attempt) {
	dir := filepath.Join(w.o.DataDir, agent.SubagentsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !strings.HasPrefix(id, a.item.EpisodeID+".s") {
			continue
		}
		doc, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if err := w.publish(ctx, a, cluster.KindSubagent, -1, bytes.TrimSuffix(doc, []byte{'\n'}), cluster.HeaderSubagent, id); err != nil {
			w.log.Warn("worker: sending a sub-agent's record", "subagent", id, "err", err)
			continue
		}
		os.Remove(filepath.Join(dir, e.Name()))
	}
}

// workerSlots are a worker's slots as an orchestrator's sub-agents take
// them (agent.Slots): the fetch loop takes no work while one waits.
type workerSlots struct{ w *worker }

func (s workerSlots) Acquire(ctx context.Context, _ string) error {
	s.w.reserving.Add(1)
	defer s.w.reserving.Add(-1)
	select {
	case <-s.w.free:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s workerSlots) Release(string) { s.w.free <- struct{}{} }

// subagentPolicy is an orchestrator task's frozen sub-agent policy as the
// worker calls it (the coordinator checked the object at admission): its
// own client behind the endpoint's cap, with its own sampling.
func (w *worker) subagentPolicy(t *agent.Task) (subagentPolicy, error) {
	var pr PolicyRequest
	if err := json.Unmarshal(t.Orchestrator.SubagentPolicy, &pr); err != nil {
		return subagentPolicy{}, err
	}
	var sampling agent.Sampling
	if len(pr.Sampling) > 0 {
		if err := json.Unmarshal(pr.Sampling, &sampling); err != nil {
			return subagentPolicy{}, err
		}
	}
	ep := w.endpoints.get(pr.BaseURL)
	cfg, info := subagentConfig(pr, sampling, w.o.PolicyAPIKey, ep)
	var p agent.Policy
	if pr.Mode == trajectory.ModeTokens {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tp, err := openai.NewTokens(ctx, cfg)
		if err != nil {
			return subagentPolicy{}, fmt.Errorf("token mode: %w", err)
		}
		tok := tp.Tokenizer()
		p, info.Mode, info.Tokenizer = tp, trajectory.ModeTokens, &tok
	} else {
		cp, err := openai.New(cfg)
		if err != nil {
			return subagentPolicy{}, err
		}
		p = cp
	}
	return subagentPolicy{policy: &sampledPolicy{inner: &gatedPolicy{inner: p, ep: ep, metrics: w.metrics}, sampling: sampling}, info: info}, nil
}

// attempt runs a claimed episode (a member of g's group, or alone when g
// is nil), streams its journal, publishes its end and waits until the
// coordinator has stored it; it returns the coordinator's action (ack,
// retry, drop), or "" when the end could not be published.
func (w *worker) attempt(ctx context.Context, msg jetstream.Msg, item cluster.WorkItem, rep cluster.ClaimReply, g *groupRun) string {
	a := &attempt{item: item, msg: msg, number: rep.Attempt, subject: cluster.JournalSubject(item.EpisodeID)}
	if g != nil {
		a.prefix = g.prefix
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.cancel = cancel
	storedCh := make(chan cluster.Stored, 4)
	w.mu.Lock()
	w.running[item.EpisodeID] = a
	w.stored[item.EpisodeID] = storedCh
	w.noteVersionsLocked(item.RolloutID, rep.Versions, time.Now())
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.running, item.EpisodeID)
		delete(w.stored, item.EpisodeID)
		w.mu.Unlock()
	}()
	done, reason := w.run(actx, a)
	switch {
	case done.InfraFailure:
		w.infraTotal.Inc()
	case reason != "":
		w.episodesTotal.WithLabelValues(reason).Inc()
	default:
		w.episodesTotal.WithLabelValues(trajectory.EndSandboxError).Inc()
	}
	if g != nil && g.prefix != nil {
		w.sendPrefixes(ctx, g) // before the member's end: stored with the group's first end
	}
	w.sendSubagents(ctx, a) // before the episode's end: its record names them
	doc := w.finalDocument(item.EpisodeID)
	if doc != nil {
		// What the coordinator indexes of it, decoded here: it stores the
		// document as it is and decodes none (its CPU is the cluster's
		// bottleneck, the workers' is not).
		var sum cluster.Summary
		if json.Unmarshal(doc, &sum) == nil {
			done.Summary = &sum
		}
	}
	body, _ := json.Marshal(done)
	var extra []string
	if doc != nil {
		extra = []string{cluster.HeaderRecord, strconv.Itoa(len(doc))}
		body = append(append(body, '\n'), doc...)
	}
	for {
		a.seqMu.Lock()
		lines := a.seq
		a.seqMu.Unlock()
		if err := w.publish(ctx, a, cluster.KindDone, lines, body, extra...); err != nil {
			w.log.Error("worker: publishing an episode's end failed; the item is left for redelivery", "episode", item.EpisodeID, "err", err)
			return ""
		}
		select {
		case st := <-storedCh:
			if st.Attempt != a.number {
				continue
			}
			os.Remove(filepath.Join(w.o.DataDir, item.EpisodeID+".json"))
			return st.Action
		case <-time.After(5 * time.Second):
			// The coordinator may have restarted: say it again.
		}
	}
}

// run runs the episode of a claimed item; it returns the attempt's Done
// and, when the episode ended here, its termination reason.
func (w *worker) run(ctx context.Context, a *attempt) (cluster.Done, string) {
	item := a.item
	task := &agent.Task{}
	if err := json.Unmarshal(item.Task, task); err != nil {
		return cluster.Done{Error: fmt.Sprintf("the work item's task: %v", err)}, ""
	}
	task.SetDir(item.TaskDir)
	rc, err := w.rollout(item)
	defer w.releaseRollout(item.RolloutID, rc)
	if err != nil {
		return cluster.Done{Error: err.Error()}, ""
	}
	pl := newPlan(task, item.Backend, w.sandboxes.warm)
	cfg := pl.config(item.RolloutID, item.GroupIndex, w.o.DataDir)
	if cfg.EpisodeID != item.EpisodeID {
		return cluster.Done{Error: fmt.Sprintf("the work item's episode id %q is not %q", item.EpisodeID, cfg.EpisodeID)}, ""
	}
	cfg.NewSandbox = w.sandboxes.create
	cfg.Prefix = a.prefix
	// A record a dead predecessor in this --data left of the episode is
	// not this attempt's (its Done would send it); nor are the records
	// and journals of the sub-agents it ran (sendSubagents would send them
	// beside this attempt's, naming sub-agents it never ran). Episode ids
	// hold no glob metacharacter.
	os.Remove(filepath.Join(w.o.DataDir, item.EpisodeID+".json"))
	left, _ := filepath.Glob(filepath.Join(w.o.DataDir, agent.SubagentsDir, item.EpisodeID+".s*"))
	for _, f := range left {
		os.Remove(f)
	}
	ep := w.endpoints.get(item.Policy.BaseURL)
	cfg.Policy = &askedPolicy{inner: &gatedPolicy{inner: rc.policy, ep: ep, rolloutSem: rc.sem, metrics: w.metrics,
		versions: attemptVersions{w, a}}, a: a, w: w}
	cfg.PolicyInfo = item.Policy.Info
	if len(item.Policy.Sampling) > 0 {
		json.Unmarshal(item.Policy.Sampling, &cfg.Sampling)
	}
	cfg.Observe = w.metrics.observer(pl.backend)
	cfg.Judges = w.judges
	cfg.TrainStep = item.TrainStep
	cfg.Journal = func(line []byte) error { return w.publishLine(ctx, a, line) }
	if task.Orchestrator != nil {
		// The tree runs here: its sub-agents take this worker's slots (a
		// waiting orchestrator lends its own), as one host's scheduler's.
		sp, err := w.subagentPolicy(task)
		if err != nil {
			return cluster.Done{Error: fmt.Sprintf("worker %s: the sub-agent policy: %v", w.o.ID, err)}, ""
		}
		cfg.Subagents = &agent.Subagents{Slots: workerSlots{w}, Policy: func(*agent.Task) (agent.Policy, trajectory.Policy, error) {
			return sp.policy, sp.info, nil
		}}
	}
	switch {
	case w.o.ConfigureEpisode != nil:
		if err := w.o.ConfigureEpisode(&cfg, item.Index); err != nil {
			return cluster.Done{InfraFailure: true, Error: fmt.Sprintf("worker %s: %v", w.o.ID, err)}, ""
		}
	case task.Retriever != nil:
		return cluster.Done{InfraFailure: true, Error: fmt.Sprintf("worker %s opens no search index (task %q names retriever.index %s)", w.o.ID, task.ID, task.IndexPath())}, ""
	}
	w.backends.get(ctx, pl.backend)
	s, err := agent.Open(ctx, cfg)
	var oe *agent.OpenError
	switch {
	case errors.As(err, &oe):
		return cluster.Done{InfraFailure: oe.Infra(), Error: oe.Error()}, ""
	case err != nil:
		return cluster.Done{Error: err.Error()}, ""
	}
	t, err := s.Drive(ctx, cfg.Policy)
	reason := ""
	if t != nil && t.Termination != nil {
		reason = t.Termination.Reason
	}
	if err != nil {
		return cluster.Done{Error: err.Error()}, reason
	}
	return cluster.Done{}, reason
}

// rollout is the item's rollout's client (one per rollout: its policy
// client and its cap on policy calls in flight), held for the episode
// until releaseRollout. The policy client is made outside the worker's
// lock (a token-mode client asks its server first): heartbeats and
// claims never wait for it.
func (w *worker) rollout(item cluster.WorkItem) (*rolloutClient, error) {
	w.mu.Lock()
	rc := w.rollouts[item.RolloutID]
	if rc == nil {
		rc = &rolloutClient{ready: make(chan struct{})}
		if item.Policy.MaxConcurrency > 0 {
			rc.sem = make(chan struct{}, item.Policy.MaxConcurrency)
		}
		w.rollouts[item.RolloutID] = rc
		rc.refs++
		w.mu.Unlock()
		rc.policy, rc.err = w.newPolicy(item.Policy)
		close(rc.ready)
	} else {
		rc.refs++
		w.mu.Unlock()
		<-rc.ready
	}
	return rc, rc.err
}

// releaseRollout ends an episode's hold on its rollout's client. A client
// that failed to be made is dropped at once, so the next episode tries
// again.
func (w *worker) releaseRollout(id string, rc *rolloutClient) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rc.refs--
	if rc.refs == 0 {
		rc.idle = time.Now()
		if rc.err != nil && w.rollouts[id] == rc {
			delete(w.rollouts, id)
		}
	}
}

// newPolicy makes a rollout's policy client.
func (w *worker) newPolicy(pp cluster.Policy) (agent.Policy, error) {
	ep := w.endpoints.get(pp.BaseURL)
	cfg := openai.Config{BaseURL: pp.BaseURL, Model: pp.Model, APIKey: w.o.PolicyAPIKey, MaxRetries: pp.MaxRetries,
		Timeout: time.Duration(pp.TimeoutS * float64(time.Second)), HTTPClient: ep.client, TokenizeURL: pp.TokenizeURL}
	if pp.Mode == trajectory.ModeTokens {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tp, err := openai.NewTokens(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("token-mode policy: %w", err)
		}
		return tp, nil
	}
	op, err := openai.New(cfg)
	if err != nil {
		return nil, err
	}
	return op, nil
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

// finalDocument is the episode's final document as the trajectory writer
// wrote it here (trailing newline cut), or nil when there is none or it is
// over cluster.MaxRecordInDone.
func (w *worker) finalDocument(id string) []byte {
	path := filepath.Join(w.o.DataDir, id+".json")
	if st, err := os.Stat(path); err != nil || st.Size() > cluster.MaxRecordInDone {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 || len(b) > cluster.MaxRecordInDone {
		return nil
	}
	return bytes.TrimSuffix(b, []byte{'\n'})
}

// publish sends one journal message and waits for JetStream's ack,
// retrying while NATS is away (up to two minutes). extra are more headers
// (name, value, ...).
func (w *worker) publish(ctx context.Context, a *attempt, kind string, seq int, body []byte, extra ...string) error {
	subject := a.subject
	if kind == cluster.KindLine {
		subject = cluster.LinesSubject(a.item.EpisodeID)
	}
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Set(cluster.HeaderEpisode, a.item.EpisodeID)
	m.Header.Set(cluster.HeaderRollout, a.item.RolloutID)
	m.Header.Set(cluster.HeaderWorker, w.o.ID)
	m.Header.Set(cluster.HeaderAttempt, strconv.Itoa(a.number))
	m.Header.Set(cluster.HeaderKind, kind)
	if seq >= 0 {
		m.Header.Set(cluster.HeaderSeq, strconv.Itoa(seq))
	}
	for i := 0; i+1 < len(extra); i += 2 {
		m.Header.Set(extra[i], extra[i+1])
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
			return fmt.Errorf("publish %s to %s: %w", kind, subject, err)
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

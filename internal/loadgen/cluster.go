package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
)

// FakeWorkersConfig is a simulated fleet of rollout workers: Workers
// processes' worth of NATS connections, Slots episodes each.
type FakeWorkersConfig struct {
	// URL is the NATS server.
	URL string
	// Workers and Slots: the fleet is Workers × Slots episodes at once.
	Workers, Slots int
	// Backend is the work queue they take from (default wasm).
	Backend string
	// Turns is the model turns of each episode (a tool call each, the last
	// one finish): 2×Turns steps journaled, as a real episode of Turns turns.
	Turns int
	// Duration is how long each simulated episode takes, its steps spread
	// over it (0: as fast as the protocol goes).
	Duration time.Duration
	// OutputBytes is the tool output recorded in each tool step.
	OutputBytes int
	// Heartbeat is the workers' heartbeat interval (default
	// cluster.DefaultHeartbeat).
	Heartbeat time.Duration
	// Dir is where the workers keep their local journals (as a real
	// worker does); a temporary directory when empty.
	Dir string
}

// FakeWorkers speak the cluster protocol at the NATS level and run no
// sandbox and no policy: each work item is claimed, its journal written
// with the real trajectory writer (a header, the sandbox, the steps, the
// end) and published line by line as a worker does, then done, and the
// item acked once the coordinator says it stored the episode. It measures
// what the coordinator sustains, not what a worker does.
type FakeWorkers struct {
	cfg    FakeWorkersConfig
	cancel context.CancelFunc
	wg     sync.WaitGroup
	dir    string
	ownDir bool

	// Completed counts episodes the coordinator said it stored (acked);
	// Skipped claims answered skip; Lines journal lines published.
	Completed, Skipped, Lines, Errors atomic.Int64

	mu      sync.Mutex
	lastErr error
	// claimMS: claim request to answer; storedMS: done published to the
	// coordinator's stored answer. Both grow when the coordinator falls
	// behind.
	claimMS, storedMS []float64
}

// Latencies are the claim round trips and the done-to-stored times the
// fleet saw, in milliseconds.
func (f *FakeWorkers) Latencies() (claim, stored Percentiles) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return PercentilesOf(slices.Clone(f.claimMS)), PercentilesOf(slices.Clone(f.storedMS))
}

func (f *FakeWorkers) note(into *[]float64, since time.Time) {
	ms := float64(time.Since(since)) / float64(time.Millisecond)
	f.mu.Lock()
	*into = append(*into, ms)
	f.mu.Unlock()
}

// StartFakeWorkers connects the fleet and starts taking work.
func StartFakeWorkers(ctx context.Context, cfg FakeWorkersConfig) (*FakeWorkers, error) {
	if cfg.Backend == "" {
		cfg.Backend = "wasm"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = cluster.DefaultHeartbeat
	}
	if cfg.Turns < 1 {
		cfg.Turns = 1
	}
	f := &FakeWorkers{cfg: cfg, dir: cfg.Dir}
	if f.dir == "" {
		d, err := os.MkdirTemp("", "rollbox-fakeworkers-")
		if err != nil {
			return nil, err
		}
		f.dir, f.ownDir = d, true
	}
	ctx, f.cancel = context.WithCancel(ctx)
	var conns []*fakeWorker
	for i := range cfg.Workers {
		id := fmt.Sprintf("fake-%d-%d", os.Getpid(), i)
		nc, js, err := cluster.Connect(cfg.URL, id)
		if err != nil {
			f.cancel()
			for _, w := range conns {
				w.nc.Close()
			}
			return nil, err
		}
		if i == 0 {
			if err := cluster.EnsureStreams(ctx, js); err != nil {
				nc.Close()
				f.cancel()
				return nil, err
			}
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, cluster.WorkStream, cluster.WorkConsumerConfig(cfg.Backend, cluster.AckWait))
		if err != nil {
			nc.Close()
			f.cancel()
			return nil, err
		}
		w := &fakeWorker{f: f, id: id, nc: nc, js: js, cons: cons, stored: map[string]chan cluster.Stored{},
			running: map[string]cluster.Running{}, slots: make(chan struct{}, cfg.Slots)}
		if _, err := nc.Subscribe(cluster.StoredSubject(id), w.onStored); err != nil {
			nc.Close()
			f.cancel()
			return nil, err
		}
		conns = append(conns, w)
	}
	for _, w := range conns {
		f.wg.Add(2)
		go func() { defer f.wg.Done(); w.heartbeats(ctx) }()
		go func() { defer f.wg.Done(); w.pull(ctx) }()
	}
	return f, nil
}

// Err is the last error a worker met (nil when none).
func (f *FakeWorkers) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

func (f *FakeWorkers) fail(err error) {
	f.Errors.Add(1)
	f.mu.Lock()
	f.lastErr = err
	f.mu.Unlock()
}

// Stop stops the fleet (each worker says it is leaving) and waits for it.
func (f *FakeWorkers) Stop() {
	f.cancel()
	f.wg.Wait()
	if f.ownDir {
		os.RemoveAll(f.dir)
	}
}

type fakeWorker struct {
	f     *FakeWorkers
	id    string
	nc    *nats.Conn
	js    jetstream.JetStream
	cons  jetstream.Consumer
	slots chan struct{}

	mu      sync.Mutex
	stored  map[string]chan cluster.Stored // episode/attempt -> its answer
	running map[string]cluster.Running
}

func (w *fakeWorker) onStored(m *nats.Msg) {
	var s cluster.Stored
	if json.Unmarshal(m.Data, &s) != nil {
		return
	}
	w.mu.Lock()
	ch := w.stored[s.EpisodeID+"/"+strconv.Itoa(s.Attempt)]
	w.mu.Unlock()
	if ch != nil {
		select {
		case ch <- s:
		default:
		}
	}
}

func (w *fakeWorker) heartbeats(ctx context.Context) {
	t := time.NewTicker(w.f.cfg.Heartbeat)
	defer t.Stop()
	host, _ := os.Hostname()
	for {
		w.mu.Lock()
		hb := cluster.Heartbeat{ID: w.id, Host: host, Backends: []string{w.f.cfg.Backend}, Slots: w.f.cfg.Slots,
			Running: len(w.running), Interval: w.f.cfg.Heartbeat, Leaving: ctx.Err() != nil}
		for _, r := range w.running {
			hb.Episodes = append(hb.Episodes, r)
		}
		w.mu.Unlock()
		b, _ := json.Marshal(hb)
		w.nc.Publish(cluster.HeartbeatSubject(w.id), b)
		if hb.Leaving {
			w.nc.Drain()
			return
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// pull fetches at most the free slots' worth of items and runs each.
func (w *fakeWorker) pull(ctx context.Context) {
	var eps sync.WaitGroup
	defer eps.Wait()
	for ctx.Err() == nil {
		free := cap(w.slots) - len(w.slots)
		if free == 0 {
			select {
			case w.slots <- struct{}{}: // wait for one, then give it back
				<-w.slots
			case <-ctx.Done():
				return
			}
			continue
		}
		batch, err := w.cons.Fetch(free, append(cluster.WorkFetchOpts(free), jetstream.FetchMaxWait(time.Second))...)
		if err != nil {
			if ctx.Err() == nil {
				w.f.fail(fmt.Errorf("fetch: %w", err))
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		for msg := range batch.Messages() {
			w.slots <- struct{}{}
			eps.Add(1)
			go func() {
				defer eps.Done()
				defer func() { <-w.slots }()
				if err := w.run(ctx, msg); err != nil && ctx.Err() == nil {
					w.f.fail(err)
				}
			}()
		}
	}
}

// run claims one work item, journals a simulated episode, and acks the
// item once the coordinator stored it.
func (w *fakeWorker) run(ctx context.Context, msg jetstream.Msg) error {
	var item cluster.WorkItem
	if err := json.Unmarshal(msg.Data(), &item); err != nil {
		msg.Term()
		return fmt.Errorf("a work item that is not JSON: %w", err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	body, _ := json.Marshal(cluster.Claim{EpisodeID: item.EpisodeID, Worker: w.id, Delivery: meta.NumDelivered, AckSubject: msg.Reply()})
	var reply cluster.ClaimReply
	for {
		asked := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rm, err := w.nc.RequestWithContext(rctx, cluster.ClaimSubject, body)
		cancel()
		if err == nil {
			w.f.note(&w.f.claimMS, asked)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			continue // the coordinator is away: ask again
		}
		if err := json.Unmarshal(rm.Data, &reply); err != nil {
			return fmt.Errorf("claim reply: %w", err)
		}
		break
	}
	switch reply.Decision {
	case cluster.DecisionSkip:
		w.f.Skipped.Add(1)
		return msg.Ack()
	case cluster.DecisionWait:
		return msg.NakWithDelay(time.Second)
	case cluster.DecisionRun:
	default:
		return fmt.Errorf("claim of %s: decision %q", item.EpisodeID, reply.Decision)
	}
	attempt := strconv.Itoa(reply.Attempt)
	key := item.EpisodeID + "/" + attempt
	stored := make(chan cluster.Stored, 1)
	w.mu.Lock()
	w.stored[key] = stored
	w.running[key] = cluster.Running{EpisodeID: item.EpisodeID, Attempt: reply.Attempt, AckSubject: msg.Reply()}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.stored, key)
		delete(w.running, key)
		w.mu.Unlock()
	}()

	seq := 0
	var record string // HeaderRecord of the Done
	publish := func(kind string, data []byte) error {
		subject := cluster.JournalSubject(item.EpisodeID)
		if kind == cluster.KindLine {
			subject = cluster.LinesSubject(item.EpisodeID)
		}
		m := nats.NewMsg(subject)
		m.Header.Set(cluster.HeaderEpisode, item.EpisodeID)
		m.Header.Set(cluster.HeaderRollout, item.RolloutID)
		m.Header.Set(cluster.HeaderWorker, w.id)
		m.Header.Set(cluster.HeaderAttempt, attempt)
		m.Header.Set(cluster.HeaderKind, kind)
		if kind == cluster.KindLine {
			m.Header.Set(cluster.HeaderSeq, strconv.Itoa(seq))
			seq++
		}
		if kind == cluster.KindDone && record != "" {
			m.Header.Set(cluster.HeaderRecord, record)
		}
		m.Data = data
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := w.js.PublishMsg(pctx, m)
		cancel()
		if err == nil && kind == cluster.KindLine {
			w.f.Lines.Add(1)
		}
		return err
	}
	if err := w.journal(ctx, item, msg, publish); err != nil {
		return err
	}
	done, _ := json.Marshal(cluster.Done{})
	// As rollbox worker does: the final document rides with the Done, with
	// its summary.
	if doc, err := os.ReadFile(filepath.Join(w.f.dir, item.EpisodeID+".json")); err == nil && len(doc) <= cluster.MaxRecordInDone {
		doc = bytes.TrimSuffix(doc, []byte{'\n'})
		var sum cluster.Summary
		json.Unmarshal(doc, &sum)
		done, _ = json.Marshal(cluster.Done{Summary: &sum})
		record = strconv.Itoa(len(doc))
		done = append(append(done, '\n'), doc...)
	}
	ended := time.Now()
	for {
		if err := publish(cluster.KindDone, done); err != nil {
			return fmt.Errorf("done of %s: %w", item.EpisodeID, err)
		}
		select {
		case s := <-stored:
			switch s.Action { // as rollbox worker answers
			case cluster.ActionAck:
				w.f.Completed.Add(1)
				w.f.note(&w.f.storedMS, ended)
				return msg.DoubleAck(ctx)
			case cluster.ActionRetry:
				return msg.NakWithDelay(200 * time.Millisecond)
			default: // drop: the attempt is no longer the episode's; leave the item
				return nil
			}
		case <-time.After(10 * time.Second): // no answer: say done again
			msg.InProgress()
		case <-ctx.Done():
			return nil
		}
	}
}

// journal writes the simulated episode with the real trajectory writer,
// publishing each line as it is written, its steps spread over Duration.
func (w *fakeWorker) journal(ctx context.Context, item cluster.WorkItem, msg jetstream.Msg, publish func(string, []byte) error) error {
	cfg := w.f.cfg
	started := time.Now()
	t := &trajectory.Trajectory{EpisodeID: item.EpisodeID, RolloutID: item.RolloutID, GroupID: item.GroupID,
		GroupIndex: item.GroupIndex, TaskID: fmt.Sprintf("task-%d", item.TaskIndex), Task: item.Task, StartedAt: started,
		Policy: item.Policy.Info, Source: trajectory.SourceRollout}
	wr, err := trajectory.NewWriterTee(w.f.dir, t, func(line []byte) error { return publish(cluster.KindLine, line) })
	if err != nil {
		return fmt.Errorf("journal of %s: %w", item.EpisodeID, err)
	}
	if err := wr.SetSandbox(trajectory.Sandbox{Backend: cfg.Backend, ID: "fake-" + item.EpisodeID, Network: "none"}); err != nil {
		return err
	}
	if err := publish(cluster.KindAsked, nil); err != nil {
		return err
	}
	output := make([]byte, cfg.OutputBytes)
	for i := range output {
		output[i] = 'a' + byte(i%26)
	}
	pace := cfg.Duration / time.Duration(2*cfg.Turns)
	lastProgress := time.Now()
	ok := true
	for turn := range cfg.Turns {
		name, args := "bash", `{"command":"true"}`
		if turn == cfg.Turns-1 {
			name, args = "finish", `{"answer":"done"}`
		}
		call := fmt.Sprintf("call_%d", turn)
		for _, s := range []trajectory.Step{
			{Type: "model", Turn: turn, StartedAt: time.Now(), ToolCalls: []trajectory.ToolCall{{ID: call, Name: name, Arguments: args}}, FinishReason: "tool_calls"},
			{Type: "tool", Turn: turn, StartedAt: time.Now(), CallID: call, Name: name, Arguments: json.RawMessage(args), OK: &ok, Output: string(output)},
		} {
			if pace > 0 {
				select {
				case <-time.After(pace):
				case <-ctx.Done():
					return nil
				}
			}
			if _, err := wr.Step(s); err != nil {
				return err
			}
			if time.Since(lastProgress) > cluster.AckWait/3 {
				msg.InProgress()
				lastProgress = time.Now()
			}
		}
	}
	total := 1.0
	answer := "done"
	return wr.End(&trajectory.Termination{Reason: trajectory.EndFinished, Step: 2*cfg.Turns - 1, Answer: &answer},
		&trajectory.Reward{Total: &total, Components: map[string]float64{"exact": 1}},
		trajectory.Stats{Turns: cfg.Turns, ToolCalls: cfg.Turns, DurationMS: float64(time.Since(started).Milliseconds())})
}

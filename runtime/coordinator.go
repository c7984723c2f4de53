package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/cluster"
)

// ClusterOptions make the service a coordinator of rollout workers over
// NATS JetStream (internal/cluster has the protocol): admitted episodes are
// published as work items instead of run here.
type ClusterOptions struct {
	// URL is the NATS server (nats://HOST:PORT).
	URL string
	// Heartbeat is the workers' heartbeat interval the coordinator expects
	// (default cluster.DefaultHeartbeat); a worker unheard for
	// cluster.MissedHeartbeats intervals is lost.
	Heartbeat time.Duration

	// claimWaits, when set (tests), makes the coordinator answer a claim of
	// an episode it says yes to "wait", as for an episode it does not hold.
	claimWaits func(episodeID string) bool
}

// episodeRunner starts the episodes the scheduler hands it, in its fair
// order: the local runner runs them in this process (Server.startJob); the
// coordinator publishes them to workers (coordinator.dispatch).
type episodeRunner interface {
	start(*job)
}

// localRunner runs episodes in this process.
type localRunner struct{ s *Server }

func (l localRunner) start(j *job) { l.s.startJob(j) }

// dispatched is an episode handed to the workers, until it ends.
type dispatched struct {
	j *job
	// claim is the current attempt's (zero before the first claim; an
	// empty Worker: none holds it).
	claim claimRecord
	// claimedAt is when the claim was made (or found, after a restart).
	claimedAt time.Time
	// deciding is set while an attempt's end (or its loss) is being
	// decided: one decision at a time.
	deciding bool
	ended    bool
	// published: its work item is in the stream (a group item's members:
	// once the item's publish returned); members is the number of episodes
	// that group item lists.
	published bool
	members   int
}

// claimRecord is an attempt as the coordinator keeps it on disk
// (a line of DATA/cluster/claims.log, claimLog), so that a restarted coordinator
// knows who runs what and whether it asked the policy.
type claimRecord struct {
	Attempt    int    `json:"attempt"`
	Worker     string `json:"worker,omitempty"`
	AckSubject string `json:"ack_subject,omitempty"`
	Delivery   uint64 `json:"delivery,omitempty"`
	Asked      bool   `json:"asked,omitempty"`
}

// clusterRollout is what a coordinator keeps of a rollout beyond a single
// host's record, to dispatch its episodes again after a restart.
type clusterRollout struct {
	Policy           cluster.Policy `json:"policy"`
	RetryInterrupted bool           `json:"retry_interrupted,omitempty"`
	TrainStep        int64          `json:"train_step,omitempty"`
	MaxStaleness     *int           `json:"max_staleness,omitempty"`
	// Versions are the policy versions announced to the rollout, oldest
	// first (kept at each announcement: a restarted coordinator goes on
	// with them).
	Versions []string `json:"versions,omitempty"`
	// Tasks are, by task index, what a work item needs beyond the task's
	// JSON (absent when no task needs any).
	Tasks []clusterTask `json:"tasks,omitempty"`
}

// clusterTask is what a worker needs of a task beyond its JSON: the
// directory of its task file and its search index's identity.
type clusterTask struct {
	Dir   string `json:"dir,omitempty"`
	Index string `json:"index,omitempty"`
}

// workerState is a worker as its heartbeats show it.
type workerState struct {
	hb       cluster.Heartbeat
	lastSeen time.Time
}

// coordinator dispatches a Server's episodes to workers and stores what
// they journal back. Its own files are under DATA/cluster: claims.log, and
// journals/ (where an attempt's lines read back from LinesStream are
// finalised, apart from the single-host journals so that a restart's
// recovery leaves them be). The episodes' lines stay in LinesStream until
// their records are stored: the coordinator does not consume them.
type coordinator struct {
	s  *Server
	nc *nats.Conn
	// ctl is a connection of its own for the workers' heartbeats and the
	// pings: they never wait behind the journal's traffic on nc.
	ctl         *nats.Conn
	js          jetstream.JetStream
	heartbeat   time.Duration
	claimWaits  func(string) bool
	journalsDir string
	claims      *claimLog
	started     time.Time
	// resumed is closed once the rollouts a previous process left are
	// dispatched again: the journal is consumed only then.
	resumed chan struct{}
	// processed is the last journal stream sequence handled in order.
	processed atomic.Uint64
	// purges are the episodes whose lines are to be purged from
	// LinesStream (their records are stored); purger drains it.
	purges    chan string
	purgeWake chan struct{}
	purgeMu   sync.Mutex
	purgeList []string

	dispatchedTotal prometheus.Counter
	lostTotal       *prometheus.CounterVec // outcome: retried, interrupted
	journalTotal    prometheus.Counter
	recordsTotal    *prometheus.CounterVec // source: worker, journal
	workersGauge    prometheus.GaugeFunc
	slotsGauge      *prometheus.GaugeVec

	mu      sync.Mutex
	eps     map[string]*dispatched
	workers map[string]*workerState
}

// newCoordinator connects to NATS and sets up the streams; run consumes.
func newCoordinator(s *Server, o ClusterOptions) (*coordinator, error) {
	nc, js, err := cluster.Connect(o.URL, "rollbox-coordinator")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cluster.EnsureStreams(ctx, js); err != nil {
		nc.Close()
		return nil, err
	}
	ctl, _, err := cluster.Connect(o.URL, "rollbox-coordinator-control")
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := &coordinator{s: s, nc: nc, ctl: ctl, js: js, heartbeat: o.Heartbeat, claimWaits: o.claimWaits, eps: map[string]*dispatched{},
		workers: map[string]*workerState{}, started: time.Now(), resumed: make(chan struct{}),
		journalsDir: filepath.Join(s.st.dir, "cluster", "journals"), purgeWake: make(chan struct{}, 1)}
	if err := os.MkdirAll(c.journalsDir, 0o755); err != nil {
		nc.Close()
		ctl.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if c.claims, err = openClaimLog(filepath.Join(s.st.dir, "cluster")); err != nil {
		nc.Close()
		ctl.Close()
		return nil, err
	}
	if c.heartbeat <= 0 {
		c.heartbeat = cluster.DefaultHeartbeat
	}
	// Episode ends are indexed in batches (bbolt's Batch): a coordinator
	// stores the ends of every worker's episodes, so it joins more of them
	// in one transaction (one commit, one fdatasync) than bbolt's 10 ms
	// default would; a worker's item is acked that much later at most.
	s.st.db.MaxBatchDelay = coordinatorBatchDelay
	c.dispatchedTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_cluster_dispatched_total",
		Help: "Episodes published to workers as work items."})
	c.lostTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_cluster_lost_attempts_total",
		Help: "Attempts lost with their worker, by what became of the episode: retried (run again elsewhere) or interrupted (ended cancelled with its partial journal)."}, []string{"outcome"})
	c.journalTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "rollbox_cluster_journal_messages_total",
		Help: "Journal messages consumed from the workers."})
	c.recordsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollbox_cluster_records_total",
		Help: "Episode records stored from their worker's ended attempt, by source: worker (the final document the worker sent with its done, stored as it is) or journal (rebuilt from the journal: a record over 512 KiB, or a worker that sent none)."}, []string{"source"})
	c.workersGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rollbox_cluster_workers",
		Help: "Workers heard from within their heartbeat window."}, func() float64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return float64(len(c.workers))
	})
	c.slotsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rollbox_cluster_slots",
		Help: "Episode slots of the live workers, by backend."}, []string{"backend"})
	s.registry.MustRegister(c.dispatchedTotal, c.lostTotal, c.journalTotal, c.recordsTotal, c.workersGauge, c.slotsGauge)
	return c, nil
}

// coordinatorBatchDelay is how long a coordinator's index waits for more
// episode ends to commit with one.
const coordinatorBatchDelay = 50 * time.Millisecond

// journalPath is where the coordinator finalises an attempt's lines read
// back from LinesStream.
func (c *coordinator) journalPath(id string) string {
	return filepath.Join(c.journalsDir, id+trajectory.PartialSuffix)
}

// attemptLines reads an attempt's journal lines back from LinesStream:
// those of its worker and number, in order of HeaderSeq, each once, up to
// the first missing one (every line a worker published before its Done, or
// before it died, is there: each was waited for until JetStream had it).
func (c *coordinator) attemptLines(id, worker string, attempt int) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(c.s.ctx, time.Minute)
	defer cancel()
	st, err := c.js.Stream(ctx, cluster.LinesStream)
	if err != nil {
		return nil, err
	}
	subject, want := cluster.LinesSubject(id), strconv.Itoa(attempt)
	bySeq := map[int][]byte{}
	for next := uint64(1); ; {
		m, err := st.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		next = m.Sequence + 1
		if m.Header.Get(cluster.HeaderWorker) != worker || m.Header.Get(cluster.HeaderAttempt) != want {
			continue
		}
		if seq, err := strconv.Atoi(m.Header.Get(cluster.HeaderSeq)); err == nil && bySeq[seq] == nil {
			bySeq[seq] = m.Data
		}
	}
	var lines [][]byte
	for i := 0; bySeq[i] != nil; i++ {
		lines = append(lines, bySeq[i])
	}
	return lines, nil
}

// recoverAttempt is an attempt's trajectory from its lines in LinesStream
// (nil, os.ErrNotExist when it journaled none), finalised as a single host
// finalises a journal: interrupted unless it had ended.
func (c *coordinator) recoverAttempt(id, worker string, attempt int) (*trajectory.Trajectory, error) {
	lines, err := c.attemptLines(id, worker, attempt)
	if err != nil {
		return nil, fmt.Errorf("reading the attempt's lines back from JetStream: %w", err)
	}
	if len(lines) == 0 {
		return nil, os.ErrNotExist
	}
	path := c.journalPath(id)
	if err := os.WriteFile(path, append(bytes.Join(lines, []byte{'\n'}), '\n'), 0o644); err != nil {
		return nil, err
	}
	defer os.Remove(path)
	return trajectory.Recover(path)
}

// purgeLines drops an episode's lines from LinesStream once its record is
// stored (in the background: purger).
func (c *coordinator) purgeLines(id string) {
	c.purgeMu.Lock()
	c.purgeList = append(c.purgeList, id)
	c.purgeMu.Unlock()
	signal(c.purgeWake)
}

// purger purges the lines of the episodes purgeLines names, until ctx
// ends. One a failed purge (NATS away) or a killed process left behind is
// purged by the next start's sweep (sweepLines).
func (c *coordinator) purger(ctx context.Context) {
	var st jetstream.Stream
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.purgeWake:
		}
		c.purgeMu.Lock()
		ids := c.purgeList
		c.purgeList = nil
		c.purgeMu.Unlock()
		for _, id := range ids {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var err error
			if st == nil {
				st, err = c.js.Stream(pctx, cluster.LinesStream)
			}
			if err == nil {
				err = st.Purge(pctx, jetstream.WithPurgeSubject(cluster.LinesSubject(id)))
			}
			cancel()
			if err != nil && ctx.Err() == nil {
				c.s.log.Warn("cluster: purging an episode's lines; the next start purges them", "episode", id, "err", err)
			}
		}
	}
}

// sweepLines purges from LinesStream the lines of the episodes that have
// ended (or are not known here): what a purge that failed, or a killed
// process, left. An episode still to run or running keeps its lines.
func (c *coordinator) sweepLines(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	st, err := c.js.Stream(ctx, cluster.LinesStream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(cluster.LinesSubjectPrefix+">"))
	if err != nil {
		c.s.log.Warn("cluster: listing the lines left in JetStream", "err", err)
		return
	}
	n := 0
	for subject := range info.State.Subjects {
		id, err := cluster.EpisodeOfToken(strings.TrimPrefix(subject, cluster.LinesSubjectPrefix))
		if err == nil {
			if rec, err := c.s.st.episode(id); err != nil || rec != nil && rec.State != episodeDone {
				continue // to run, running, or not readable now: kept
			}
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			c.s.log.Warn("cluster: purging lines left in JetStream", "subject", subject, "err", err)
			return
		}
		n++
	}
	if n > 0 {
		c.s.log.Info("cluster: purged the lines of ended episodes left in JetStream", "episodes", n)
	}
}

// saveClaim keeps an attempt's claim on disk (see claimRecord, claimLog).
func (c *coordinator) saveClaim(id string, cl claimRecord) {
	if err := c.claims.save(id, cl); err != nil {
		c.s.log.Error("cluster: keeping a claim", "episode", id, "err", err)
	}
}

func (c *coordinator) readClaim(id string) (claimRecord, bool) { return c.claims.get(id) }

func (c *coordinator) dropClaim(id string) {
	if err := c.claims.drop(id); err != nil {
		c.s.log.Error("cluster: dropping a claim", "episode", id, "err", err)
	}
}

// run consumes the core subjects and, once the rollouts a previous process
// left are dispatched again, the journal stream, until ctx ends.
func (c *coordinator) run(ctx context.Context) error {
	claims, err := c.nc.QueueSubscribe(cluster.ClaimSubject, cluster.CoordinatorQueue, func(m *nats.Msg) { go c.onClaim(m) })
	if err != nil {
		return err
	}
	defer claims.Unsubscribe()
	hbs, err := c.ctl.Subscribe(cluster.HeartbeatSubjectPrefix+"*", c.onHeartbeat)
	if err != nil {
		return err
	}
	defer hbs.Unsubscribe()
	go c.reapWorkers(ctx)
	select {
	case <-c.resumed:
	case <-ctx.Done():
		return nil
	}
	go c.purger(ctx)
	go c.sweepLines(ctx)
	var cons jetstream.Consumer
	for {
		// Made anew: what a previous process was delivered and did not
		// acknowledge comes again at once, in order.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.js.DeleteConsumer(cctx, cluster.JournalStream, cluster.CoordinatorConsumer)
		if err == nil || errors.Is(err, jetstream.ErrConsumerNotFound) {
			cons, err = c.js.CreateOrUpdateConsumer(cctx, cluster.JournalStream, cluster.JournalConsumerConfig())
		}
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		c.s.log.Warn("cluster: JetStream consumer of the journal; retrying", "err", err)
		time.Sleep(time.Second)
	}
	// The iterator is made again when it closes (NATS away too long).
	for ctx.Err() == nil {
		it, err := cons.Messages(jetstream.PullMaxMessages(512))
		if err != nil {
			c.s.log.Warn("cluster: reading the journal stream; retrying", "err", err)
			time.Sleep(time.Second)
			continue
		}
		stop := context.AfterFunc(ctx, it.Stop)
		for {
			msg, err := it.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					break
				}
				if ctx.Err() == nil {
					c.s.log.Warn("cluster: reading the journal stream", "err", err)
				}
				continue
			}
			c.onJournal(msg)
		}
		stop()
		it.Stop()
	}
	return nil
}

// close stops talking to NATS.
func (c *coordinator) close() {
	c.nc.Drain()
	c.ctl.Drain()
	c.claims.close()
}

// start publishes a started job as a work item (episodeRunner). It is
// called by the scheduler's dispatcher in fair order; the publish is
// retried while NATS is away.
func (c *coordinator) start(j *job) {
	s, r := c.s, j.r
	s.metrics.Episodes.WithLabelValues("queued").Dec()
	s.metrics.Episodes.WithLabelValues("running").Inc()
	r.mu.Lock()
	r.running++
	first := r.rec.State == RolloutQueued
	if first {
		r.rec.State = RolloutRunning
	}
	r.mu.Unlock()
	if first {
		s.saveRollout(r)
	}
	d := &dispatched{j: j}
	if cl, ok := c.readClaim(j.ep.rec.ID); ok {
		d.claim.Attempt = cl.Attempt // attempts before a restart
	}
	c.mu.Lock()
	c.eps[j.ep.rec.ID] = d
	publish := j.batch == nil
	if b := j.batch; b != nil {
		b.started++
		publish = b.started == len(b.jobs)
	}
	c.mu.Unlock()
	if publish {
		c.publish(j)
	}
}

// publish publishes a job's work item (msg id: the episode id), retrying
// while NATS is away.
func (c *coordinator) publish(j *job) {
	s, r, e := c.s, j.r, j.ep
	item := cluster.WorkItem{EpisodeID: e.rec.ID, RolloutID: r.id, GroupID: e.rec.GroupID, GroupIndex: e.rec.GroupIndex,
		TaskIndex: e.rec.TaskIndex, Task: r.rec.Tasks[e.rec.TaskIndex], Backend: j.plan.backend, Policy: *r.wire, TrainStep: r.trainStep}
	if r.maxStaleness >= 0 {
		m := r.maxStaleness
		item.MaxStaleness = &m
	}
	if cl := r.rec.Cluster; cl != nil && e.rec.TaskIndex < len(cl.Tasks) {
		item.TaskDir, item.Index = cl.Tasks[e.rec.TaskIndex].Dir, cl.Tasks[e.rec.TaskIndex].Index
	}
	subject, msgID := cluster.WorkSubject(j.plan.backend, e.rec.ID), e.rec.ID
	if b := j.batch; b != nil {
		// The group's episodes still to run, as one item.
		item.EpisodeID, item.GroupIndex = "", 0
		for _, x := range b.jobs {
			item.Members = append(item.Members, cluster.Member{EpisodeID: x.ep.rec.ID, GroupIndex: x.ep.rec.GroupIndex})
		}
		subject, msgID = cluster.GroupWorkSubject(j.plan.backend, e.rec.GroupID), cluster.GroupMsgID(e.rec.GroupID)
		c.mu.Lock()
		if e.group.redispatch {
			// Published before and taken back (or by an earlier process):
			// the stream's duplicate window must not drop this one.
			msgID += "." + strconv.FormatInt(time.Now().UnixNano(), 36)
		}
		e.group.redispatch = true
		c.mu.Unlock()
	}
	body, _ := json.Marshal(item)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		_, err := c.js.Publish(ctx, subject, body, jetstream.WithMsgID(msgID))
		cancel()
		if err == nil {
			c.dispatchedTotal.Inc()
			c.mu.Lock()
			if b := j.batch; b != nil {
				for _, x := range b.jobs {
					if d := c.eps[x.ep.rec.ID]; d != nil {
						d.published, d.members = true, len(b.jobs)
					}
				}
			} else if d := c.eps[e.rec.ID]; d != nil {
				d.published = true
			}
			c.mu.Unlock()
			return
		}
		if s.ctx.Err() != nil {
			return // shutting down: a restart dispatches it again
		}
		if attempt%20 == 0 {
			s.log.Warn("cluster: publishing a work item failed; retrying", "episode", e.rec.ID, "err", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// onClaim answers a worker's Claim.
func (c *coordinator) onClaim(m *nats.Msg) {
	var cl cluster.Claim
	if err := json.Unmarshal(m.Data, &cl); err != nil || cl.EpisodeID == "" && len(cl.Members) == 0 || cl.Worker == "" {
		c.reply(m, cluster.ClaimReply{Decision: cluster.DecisionSkip, Reason: "malformed claim"})
		return
	}
	if len(cl.Members) > 0 {
		c.reply(m, c.claimGroup(cl))
		return
	}
	if c.claimWaits != nil && c.claimWaits(cl.EpisodeID) {
		c.reply(m, cluster.ClaimReply{Decision: cluster.DecisionWait, Reason: "held by the test"})
		return
	}
	for {
		c.mu.Lock()
		d := c.eps[cl.EpisodeID]
		switch classifyClaim(d, cl) {
		case claimUnknown:
			c.mu.Unlock()
			c.reply(m, c.unknownClaim(cl.EpisodeID))
			return
		case claimBusy:
			c.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			continue
		case claimFree:
			d.take(cl)
			rec := d.claim
			c.mu.Unlock()
			c.saveClaim(cl.EpisodeID, rec)
			c.reply(m, cluster.ClaimReply{Decision: cluster.DecisionRun, Attempt: rec.Attempt, Versions: d.j.r.versionList()})
			return
		case claimSame:
			attempt := d.claim.Attempt
			c.mu.Unlock()
			c.reply(m, cluster.ClaimReply{Decision: cluster.DecisionRun, Attempt: attempt, Versions: d.j.r.versionList()})
			return
		}
		// claimLost
		d.deciding = true
		c.mu.Unlock()
		c.lost(d, fmt.Sprintf("its work item was redelivered (delivery %d) to worker %s", cl.Delivery, cl.Worker), false)
	}
}

// claimCase is what a claim finds of an episode (classifyClaim); a single
// item's claim (onClaim) and each member of a group item's (claimGroup)
// are decided by it alike.
type claimCase int

const (
	// claimUnknown: not in flight here, ended or not known (yet):
	// unknownClaim answers.
	claimUnknown claimCase = iota
	// claimBusy: an attempt's end (or loss) is being decided: asked again
	// shortly.
	claimBusy
	// claimFree: no attempt holds it: the claim takes it (dispatched.take).
	claimFree
	// claimSame: this very claim again (its answer was lost): the same
	// attempt runs.
	claimSame
	// claimLost: redelivered while another attempt is on record: that
	// attempt was lost (coordinator.lost decides it).
	claimLost
)

// classifyClaim says what claim cl finds of d (the episode's dispatched
// state, nil when it is not in flight here); c.mu held.
func classifyClaim(d *dispatched, cl cluster.Claim) claimCase {
	switch {
	case d == nil || d.ended:
		return claimUnknown
	case d.deciding:
		return claimBusy
	case d.claim.Worker == "":
		return claimFree
	case d.claim.Worker == cl.Worker && d.claim.Delivery == cl.Delivery:
		return claimSame
	}
	return claimLost
}

// take makes claim cl the episode's next attempt (claimFree); c.mu held.
func (d *dispatched) take(cl cluster.Claim) {
	d.claim = claimRecord{Attempt: d.claim.Attempt + 1, Worker: cl.Worker, AckSubject: cl.AckSubject, Delivery: cl.Delivery}
	d.claimedAt = time.Now()
}

// claimGroup answers a group item's claim: each member decided as a
// claim of its own would be (onClaim), all at once: when one must wait (the
// coordinator does not hold it, or it is ending now) the answer is wait and
// no member is claimed, so no attempt is counted of a member that never
// ran and none runs without the others.
func (c *coordinator) claimGroup(cl cluster.Claim) cluster.ClaimReply {
	for {
		var unknown []string
		var lostDs []*dispatched
		busy := false
		c.mu.Lock()
		for _, id := range cl.Members {
			d := c.eps[id]
			switch classifyClaim(d, cl) {
			case claimUnknown:
				unknown = append(unknown, id)
			case claimBusy:
				busy = true
			case claimLost:
				d.deciding = true
				lostDs = append(lostDs, d)
			}
		}
		c.mu.Unlock()
		if len(lostDs) > 0 {
			var wg sync.WaitGroup
			for _, d := range lostDs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.lost(d, fmt.Sprintf("its group's work item was redelivered (delivery %d) to worker %s", cl.Delivery, cl.Worker), false)
				}()
			}
			wg.Wait()
			continue
		}
		if busy {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		answers := map[string]cluster.ClaimReply{}
		for _, id := range unknown {
			a := c.unknownClaim(id)
			if a.Decision == cluster.DecisionWait {
				return cluster.ClaimReply{Decision: cluster.DecisionWait, Reason: fmt.Sprintf("episode %s: %s", id, a.Reason)}
			}
			answers[id] = a
		}
		for _, id := range cl.Members {
			if _, ok := answers[id]; !ok && c.claimWaits != nil && c.claimWaits(id) {
				return cluster.ClaimReply{Decision: cluster.DecisionWait, Reason: fmt.Sprintf("episode %s: held by the test", id)}
			}
		}
		// Claim the members to run, all under one lock, unless one changed
		// meanwhile (then decide again).
		var saves []string
		var r *rollout // the members' (one group: one rollout)
		out := cluster.ClaimReply{Decision: cluster.DecisionRun, Members: make([]cluster.ClaimReply, len(cl.Members))}
		changed := false
		c.mu.Lock()
		for _, id := range cl.Members {
			_, wasUnknown := answers[id]
			k := classifyClaim(c.eps[id], cl)
			if wasUnknown != (k == claimUnknown) || k == claimBusy || k == claimLost {
				changed = true
				break
			}
		}
		if !changed {
			for i, id := range cl.Members {
				if a, ok := answers[id]; ok {
					out.Members[i] = a
					continue
				}
				d := c.eps[id]
				if classifyClaim(d, cl) == claimFree {
					d.take(cl)
					saves = append(saves, id)
				} // else claimSame
				out.Members[i] = cluster.ClaimReply{Decision: cluster.DecisionRun, Attempt: d.claim.Attempt}
				r = d.j.r
			}
		}
		recs := make([]claimRecord, len(saves))
		for i, id := range saves {
			recs[i] = c.eps[id].claim
		}
		c.mu.Unlock()
		if changed {
			continue
		}
		for i, id := range saves {
			c.saveClaim(id, recs[i])
		}
		if r != nil {
			vs := r.versionList()
			for i := range out.Members {
				if out.Members[i].Decision == cluster.DecisionRun {
					out.Members[i].Versions = vs
				}
			}
		}
		return out
	}
}

// versionList is a copy of the rollout's announced policy versions.
func (r *rollout) versionList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.versions)
}

// announce tells the workers a rollout's policy versions after an
// announcement and returns how many episodes they cancelled as stale: it
// waits (up to two seconds) for the answer of each worker that holds one of
// the rollout's episodes; a worker that does not answer in time still
// cancels its stale episodes (they end cancelled), uncounted here.
func (c *coordinator) announce(r *rollout) int {
	vs := r.versionList()
	r.mu.Lock()
	if r.rec.Cluster != nil {
		r.rec.Cluster.Versions = vs
	}
	r.mu.Unlock()
	c.s.saveRollout(r)
	body, _ := json.Marshal(cluster.Versions{RolloutID: r.id, Versions: vs})
	expected := map[string]bool{}
	c.mu.Lock()
	for _, d := range c.eps {
		if d.j.r == r && !d.ended && d.claim.Worker != "" {
			expected[d.claim.Worker] = true
		}
	}
	c.mu.Unlock()
	inbox := c.nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		c.s.log.Warn("cluster: announcing a policy version", "rollout", r.id, "err", err)
		return 0
	}
	defer sub.Unsubscribe()
	if err := c.nc.PublishRequest(cluster.VersionsSubject, inbox, body); err != nil {
		c.s.log.Warn("cluster: announcing a policy version", "rollout", r.id, "err", err)
		return 0
	}
	timeout := time.NewTimer(2 * time.Second)
	defer timeout.Stop()
	n := 0
	for len(expected) > 0 {
		select {
		case m := <-ch:
			var ack cluster.VersionsAck
			if json.Unmarshal(m.Data, &ack) != nil || ack.Worker == "" {
				continue // e.g. "no responders"
			}
			n += ack.Cancelled
			delete(expected, ack.Worker)
		case <-timeout.C:
			c.s.log.Warn("cluster: workers did not answer a policy version announcement in 2s", "rollout", r.id, "workers", len(expected))
			return n
		}
	}
	return n
}

// unknownClaim answers the claim of an episode not in flight here: ended
// (a duplicate) or not known (yet).
func (c *coordinator) unknownClaim(id string) cluster.ClaimReply {
	rec, err := c.s.st.episode(id)
	if err == nil && rec != nil && rec.State == episodeDone {
		return cluster.ClaimReply{Decision: cluster.DecisionSkip, Reason: "the episode has ended"}
	}
	if err == nil && rec == nil {
		return cluster.ClaimReply{Decision: cluster.DecisionSkip, Reason: "no such episode"}
	}
	return cluster.ClaimReply{Decision: cluster.DecisionWait, Reason: "the coordinator does not hold this episode yet"}
}

func (c *coordinator) reply(m *nats.Msg, v any) {
	b, _ := json.Marshal(v)
	if err := m.Respond(b); err != nil {
		c.s.log.Warn("cluster: answering a claim", "err", err)
	}
}

// catchUp waits until the journal consumer has handled every message
// published so far (bounded), so a decision about a lost attempt sees all
// it journaled.
func (c *coordinator) catchUp() {
	ctx, cancel := context.WithTimeout(c.s.ctx, 5*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, cluster.JournalStream)
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	last := info.State.LastSeq
	for c.processed.Load() < last && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// lost decides an attempt whose worker is gone (d.deciding is set by the
// caller). One that never asked the policy is kept as an infrastructure
// attempt and the episode runs again (its item nak'ed at once when
// naknow), up to Limits.InfraAttempts attempts; one that asked ends the
// episode cancelled, interrupted, with its partial journal — or runs again
// when the rollout says retry_interrupted.
func (c *coordinator) lost(d *dispatched, why string, naknow bool) {
	c.catchUp()
	s, r, e := c.s, d.j.r, d.j.ep
	c.mu.Lock()
	cl := d.claim
	c.mu.Unlock()
	msg := fmt.Sprintf("worker %s was lost in attempt %d: %s", cl.Worker, cl.Attempt, why)
	var t *trajectory.Trajectory
	var rerr error
	if cl.Worker != "" {
		t, rerr = c.recoverAttempt(e.rec.ID, cl.Worker, cl.Attempt)
	}
	if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		s.log.Warn("cluster: reading a lost attempt's journal", "episode", e.rec.ID, "err", rerr)
	}
	if t == nil {
		t = unstartedTrajectory(e.rec, e.task, r.backend, r.rec.Policy, trajectory.EndInterrupted, msg)
	}
	retry := (!cl.Asked || r.retryInterrupted) && cl.Attempt < s.limits.InfraAttempts
	if retry {
		if t.Termination != nil && t.Termination.Reason == trajectory.EndInterrupted {
			t.Termination.Message = msg
		}
		if err := trajectory.WriteFile(filepath.Join(s.st.attemptsDir, fmt.Sprintf("%s.%d.json", e.rec.ID, cl.Attempt)), t); err != nil {
			s.log.Error("cluster: keeping a lost attempt", "episode", e.rec.ID, "err", err)
		}
		if !cl.Asked {
			r.mu.Lock()
			r.rec.InfraRetries++
			r.mu.Unlock()
			s.metrics.InfraRetries.WithLabelValues(d.j.plan.backend).Inc()
		}
		c.lostTotal.WithLabelValues("retried").Inc()
		s.log.Warn("cluster: attempt lost; the episode runs again", "episode", e.rec.ID, "attempt", cl.Attempt, "asked", cl.Asked, "why", why)
		c.mu.Lock()
		d.claim = claimRecord{Attempt: cl.Attempt}
		d.deciding = false
		c.mu.Unlock()
		c.saveClaim(e.rec.ID, d.claim)
		if naknow && cl.AckSubject != "" {
			c.nc.Publish(cl.AckSubject, []byte("-NAK"))
		}
		return
	}
	if cl.Asked {
		// The policy's tokens were spent: a re-run would be another
		// sample. The episode ends with what it journaled.
		t.Termination = &trajectory.Termination{Reason: trajectory.EndCancelled, Interrupted: true, Message: msg, Step: len(t.Steps) - 1}
	} else {
		msg += fmt.Sprintf("; %d attempts were lost before the policy was asked", cl.Attempt)
		t.Termination = &trajectory.Termination{Reason: trajectory.EndSandboxError, Message: msg, Step: len(t.Steps) - 1}
	}
	t.Reward = nil
	c.lostTotal.WithLabelValues("interrupted").Inc()
	s.log.Warn("cluster: attempt lost; the episode ends with its partial journal", "episode", e.rec.ID, "attempt", cl.Attempt, "asked", cl.Asked, "why", why)
	c.finish(d, t)
	switch {
	case cl.AckSubject == "":
	case d.j.groupItem():
		// A group item holds other members: it goes back (a worker then
		// runs those still to run and skips the ended ones), unless it was
		// redelivered already.
		if naknow {
			c.nc.Publish(cl.AckSubject, []byte("-NAK"))
		}
	default:
		c.nc.Publish(cl.AckSubject, []byte("+TERM"))
	}
}

// finish stores an episode's record and its end (the index, the rollout's
// counts and groups), then releases its slot.
func (c *coordinator) finish(d *dispatched, t *trajectory.Trajectory) {
	c.finishDoc(d, t, nil)
}

// finishDoc is finish with t's document as written already (doc, when not
// nil), stored as it is (t then need only hold what the index takes:
// cluster.Summary).
func (c *coordinator) finishDoc(d *dispatched, t *trajectory.Trajectory, doc []byte) {
	s, r, e := c.s, d.j.r, d.j.ep
	c.mu.Lock()
	if d.ended {
		c.mu.Unlock()
		return
	}
	d.ended = true
	delete(c.eps, e.rec.ID)
	c.mu.Unlock()
	var err error
	write := func() error { return trajectory.WriteFile(s.st.trajectoryPath(e.rec.ID), t) }
	if doc != nil {
		// A group commit: one file-system sync for the records of every
		// episode ending meanwhile, not an fsync each.
		write = func() error { return trajectory.CommitDocument(s.st.trajectoryPath(e.rec.ID), doc) }
	}
	if werr := write(); werr != nil {
		err = &agent.RecordError{EpisodeID: e.rec.ID, Err: werr}
		t = nil
	} else {
		c.purgeLines(e.rec.ID)
	}
	c.dropClaim(e.rec.ID) // the record (or its record_error) decides a restart now
	s.metrics.Episodes.WithLabelValues("running").Dec()
	r.mu.Lock()
	r.running--
	r.mu.Unlock()
	s.endEpisode(r, e, t, err)
	s.sched.done(d.j)
}

// onJournal handles one message of the journal stream.
func (c *coordinator) onJournal(msg jetstream.Msg) {
	c.journalTotal.Inc()
	defer func() {
		if meta, err := msg.Metadata(); err == nil {
			c.processed.Store(meta.Sequence.Stream)
		}
	}()
	h := msg.Headers()
	id, worker, kind := h.Get(cluster.HeaderEpisode), h.Get(cluster.HeaderWorker), h.Get(cluster.HeaderKind)
	attempt, _ := strconv.Atoi(h.Get(cluster.HeaderAttempt))
	if kind == cluster.KindPrefix {
		c.keepPrefix(id, h.Get(cluster.HeaderRollout), msg.Data())
		msg.Ack()
		return
	}
	c.mu.Lock()
	d := c.eps[id]
	if d == nil || d.ended || d.claim.Attempt != attempt || d.claim.Worker != worker {
		c.mu.Unlock()
		if kind == cluster.KindDone {
			switch {
			case d != nil && !d.ended:
				c.stored(worker, id, attempt, cluster.ActionDrop) // an attempt taken for lost
			default:
				// Done again for an episode stored already (its Stored was lost).
				if rec, err := c.s.st.episode(id); err == nil && rec != nil && rec.State == episodeDone {
					c.stored(worker, id, attempt, cluster.ActionAck)
				}
			}
		}
		msg.Ack()
		return
	}
	if d.deciding {
		c.mu.Unlock()
		if kind == cluster.KindDone {
			msg.NakWithDelay(time.Second) // decided meanwhile: seen again after the decision
			return
		}
		msg.Ack() // the attempt is being taken for lost: what it says now is not kept
		return
	}
	switch kind {
	case cluster.KindSubagent:
		c.mu.Unlock()
		c.keepSubagent(id, h.Get(cluster.HeaderSubagent), msg.Data())
		msg.Ack()
	case cluster.KindAsked:
		d.claim.Asked = true
		cl := d.claim
		c.mu.Unlock()
		c.saveClaim(id, cl)
		msg.Ack()
	case cluster.KindDone:
		var done cluster.Done
		body, doc := msg.Data(), []byte(nil)
		if n, err := strconv.Atoi(h.Get(cluster.HeaderRecord)); err == nil && n > 0 && n < len(body) && body[len(body)-n-1] == '\n' {
			body, doc = body[:len(body)-n-1], body[len(body)-n:]
		}
		json.Unmarshal(body, &done)
		d.deciding = true
		c.mu.Unlock()
		go func() {
			c.done(d, worker, attempt, done, doc)
			msg.Ack()
		}()
	default:
		// KindLine of a worker of an earlier version (lines go to
		// LinesStream): not kept.
		c.mu.Unlock()
		msg.Ack()
	}
}

// keepPrefix stores the record of a prefix episode a worker ran for a
// group item under DATA/prefixes, as one host keeps it (the members'
// forked_from names it): only a prefix of a rollout of this coordinator.
func (c *coordinator) keepPrefix(id, rolloutID string, doc []byte) {
	s := c.s
	s.mu.Lock()
	r := s.rollouts[rolloutID]
	s.mu.Unlock()
	rest, ok := strings.CutPrefix(id, rolloutID+".")
	if r == nil || !ok || !strings.Contains(rest, ".prefix") || strings.ContainsAny(id, `/\`) || !filepath.IsLocal(id) {
		s.log.Warn("cluster: a prefix record of no rollout here; dropped", "prefix", id, "rollout", rolloutID)
		return
	}
	var t trajectory.Trajectory
	if json.Unmarshal(doc, &t) != nil || t.EpisodeID != id {
		s.log.Warn("cluster: a prefix record that is not one; dropped", "prefix", id)
		return
	}
	dir := filepath.Join(s.st.dir, "prefixes")
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = trajectory.WriteDocument(filepath.Join(dir, id+".json"), doc)
	}
	if err != nil {
		s.log.Error("cluster: keeping a prefix's record", "prefix", id, "err", err)
	}
}

// keepSubagent stores the record of a sub-agent of orchestrator episode
// id (the current attempt's) beside the episode's record, where one host
// writes it (DATA/episodes/subagents/).
func (c *coordinator) keepSubagent(id, sub string, doc []byte) {
	s := c.s
	rest, ok := strings.CutPrefix(sub, id+".s")
	if !ok || rest == "" || strings.ContainsAny(sub, `/\`) || !filepath.IsLocal(sub) {
		s.log.Warn("cluster: a sub-agent record of another episode; dropped", "episode", id, "subagent", sub)
		return
	}
	dir := filepath.Join(s.st.episodesDir, agent.SubagentsDir)
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = trajectory.WriteDocument(filepath.Join(dir, sub+".json"), doc)
	}
	if err != nil {
		s.log.Error("cluster: keeping a sub-agent's record", "subagent", sub, "err", err)
	}
}

// done stores an ended attempt: the episode's record, or an infrastructure
// attempt to retry; then tells the worker. doc is the final document the
// worker sent with its Done, if it did: stored as it is when it is this
// episode's ended record, else the record is rebuilt from the journal.
func (c *coordinator) done(d *dispatched, worker string, attempt int, done cluster.Done, doc []byte) {
	s, r, e := c.s, d.j.r, d.j.ep
	var t *trajectory.Trajectory
	var err error
	if doc != nil {
		if sum := done.Summary; sum != nil {
			// Decoded by the worker from doc: stored as it is, decoded here
			// not at all.
			t = sum.Trajectory()
		} else {
			t = &trajectory.Trajectory{}
			if json.Unmarshal(doc, t) != nil {
				t = nil
			}
		}
		if t == nil || t.EpisodeID != e.rec.ID || t.Termination == nil {
			t, doc = nil, nil
		}
	}
	if t == nil {
		t, err = c.recoverAttempt(e.rec.ID, worker, attempt)
	}
	if err != nil {
		doc = nil
		msg := "the worker's journal of this episode could not be read: " + err.Error()
		if done.Error != "" {
			msg = "the episode failed on worker " + worker + ": " + done.Error
		}
		t = unstartedTrajectory(e.rec, e.task, r.backend, r.rec.Policy, trajectory.EndSandboxError, msg)
	}
	if done.InfraFailure && attempt < s.limits.InfraAttempts {
		path := filepath.Join(s.st.attemptsDir, fmt.Sprintf("%s.%d.json", e.rec.ID, attempt))
		werr := error(nil)
		if doc != nil {
			werr = trajectory.WriteDocument(path, doc)
		} else {
			werr = trajectory.WriteFile(path, t)
		}
		if werr != nil {
			s.log.Error("cluster: keeping a failed attempt", "episode", e.rec.ID, "err", werr)
		}
		r.mu.Lock()
		r.rec.InfraRetries++
		r.mu.Unlock()
		s.metrics.InfraRetries.WithLabelValues(d.j.plan.backend).Inc()
		s.log.Warn("infrastructure failure before the first policy call; retrying", "episode", e.rec.ID, "attempt", attempt, "worker", worker, "reason", done.Error)
		c.mu.Lock()
		d.claim = claimRecord{Attempt: attempt}
		d.deciding = false
		c.mu.Unlock()
		c.saveClaim(e.rec.ID, d.claim)
		c.stored(worker, e.rec.ID, attempt, cluster.ActionRetry)
		return
	}
	source := "journal"
	if doc != nil {
		source = "worker"
	}
	c.recordsTotal.WithLabelValues(source).Inc()
	c.finishDoc(d, t, doc)
	c.stored(worker, e.rec.ID, attempt, cluster.ActionAck)
}

func (c *coordinator) stored(worker, id string, attempt int, action string) {
	b, _ := json.Marshal(cluster.Stored{EpisodeID: id, Attempt: attempt, Action: action})
	c.nc.Publish(cluster.StoredSubject(worker), b)
}

// onHeartbeat notes a worker.
func (c *coordinator) onHeartbeat(m *nats.Msg) {
	var hb cluster.Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil || hb.ID == "" {
		return
	}
	c.mu.Lock()
	_, known := c.workers[hb.ID]
	if hb.Leaving {
		delete(c.workers, hb.ID)
	} else {
		w := c.workers[hb.ID]
		if w == nil {
			w = &workerState{}
			c.workers[hb.ID] = w
			c.s.log.Info("cluster: worker joined", "worker", hb.ID, "host", hb.Host, "backends", hb.Backends, "slots", hb.Slots)
		}
		w.hb, w.lastSeen = hb, time.Now()
	}
	c.mu.Unlock()
	if !known || hb.Leaving {
		c.resize()
	}
}

// maxSlots is the largest live worker's slots per backend.
func (c *coordinator) maxSlots() map[string]int {
	out := map[string]int{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.workers {
		for _, b := range w.hb.Backends {
			out[b] = max(out[b], w.hb.Slots)
		}
	}
	return out
}

// resize gives the scheduler the live workers' slots per backend.
func (c *coordinator) resize() {
	slots, maxSlots := map[string]int{}, map[string]int{}
	c.mu.Lock()
	for _, w := range c.workers {
		for _, b := range w.hb.Backends {
			slots[b] += w.hb.Slots
			maxSlots[b] = max(maxSlots[b], w.hb.Slots)
		}
	}
	c.mu.Unlock()
	c.slotsGauge.Reset()
	for b, n := range slots {
		c.slotsGauge.WithLabelValues(b).Set(float64(n))
	}
	c.s.sched.setClusterSlots(slots, maxSlots)
	c.takeBackUnheldGroups(maxSlots)
}

// takeBackUnheldGroups takes back from the workers the group items no live
// worker can hold any more (the group's worker with slots enough left or
// died after the item was published; a smaller one leaves it): each item
// is removed from the work stream and its episodes still to run go back
// to the end of their rollout's queue, their slots freed, so that they hold
// none and the rollout's other episodes run meanwhile; the scheduler starts
// the group again (a new item) once a worker with a slot for each of them
// is live. Only an item none of whose episodes is claimed is taken back,
// and none before the workers' heartbeats had a window to come in (a
// restarted coordinator knows no worker at first).
func (c *coordinator) takeBackUnheldGroups(maxSlots map[string]int) {
	if time.Since(c.started) < time.Duration(cluster.MissedHeartbeats)*c.heartbeat {
		return // the live workers have not all announced themselves yet
	}
	type group struct {
		r     *rollout
		item  string
		ds    []*dispatched
		slots int
	}
	var groups []group
	seen := map[*groupState]bool{}
	c.mu.Lock()
	for _, d := range c.eps {
		g := d.j.ep.group
		if !d.j.groupItem() || seen[g] || !d.published || d.members <= maxSlots[d.j.plan.backend] {
			continue
		}
		seen[g] = true
		var ds []*dispatched
		for _, m := range g.members {
			x := c.eps[m.rec.ID]
			if x == nil {
				continue // ended, or queued
			}
			if x.claim.Worker != "" || x.deciding || x.ended || !x.published {
				ds = nil
				break
			}
			ds = append(ds, x)
		}
		if len(ds) == 0 {
			continue
		}
		for _, x := range ds {
			x.deciding = true // a claim of it waits
		}
		groups = append(groups, group{r: d.j.r, item: cluster.GroupWorkSubject(d.j.plan.backend, g.id), ds: ds, slots: maxSlots[d.j.plan.backend]})
	}
	c.mu.Unlock()
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.s.ctx, 10*time.Second)
	defer cancel()
	stream, err := c.js.Stream(ctx, cluster.WorkStream)
	for _, g := range groups {
		if err == nil {
			err = stream.Purge(ctx, jetstream.WithPurgeSubject(g.item))
		}
		c.mu.Lock()
		for _, d := range g.ds {
			d.deciding = false
			if err == nil {
				delete(c.eps, d.j.ep.rec.ID)
			}
		}
		c.mu.Unlock()
		if err != nil {
			c.s.log.Warn("cluster: taking back a group item no live worker can hold; tried again at the next check", "group", g.ds[0].j.ep.group.id, "err", err)
			continue
		}
		jobs := make([]*job, len(g.ds))
		for i, d := range g.ds {
			jobs[i] = d.j
		}
		if !c.s.sched.requeue(g.r, jobs) {
			// The rollout stopped meanwhile: they end as its unclaimed
			// episodes do.
			g.r.mu.Lock()
			message := g.r.rec.Message
			g.r.mu.Unlock()
			for _, d := range g.ds {
				c.mu.Lock()
				c.eps[d.j.ep.rec.ID] = d
				c.mu.Unlock()
				c.finish(d, unstartedTrajectory(d.j.ep.rec, d.j.ep.task, g.r.backend, g.r.rec.Policy, trajectory.EndCancelled, message+" (before a worker took the episode)"))
			}
			continue
		}
		n := float64(len(jobs))
		c.s.metrics.Episodes.WithLabelValues("running").Sub(n)
		c.s.metrics.Episodes.WithLabelValues("queued").Add(n)
		g.r.mu.Lock()
		g.r.running -= len(jobs)
		g.r.mu.Unlock()
		c.s.log.Warn("cluster: a group item no live worker can hold went back to the queue; it runs again when a worker with a slot for each of its episodes is live",
			"group", g.ds[0].j.ep.group.id, "episodes", len(jobs), "largest_worker_slots", g.slots)
	}
}

// reapWorkers drops workers unheard for cluster.MissedHeartbeats
// intervals and decides the attempts of workers not live (lost, or not
// heard from since this coordinator started: dead while it was away) once
// their claim is older than that window.
func (c *coordinator) reapWorkers(ctx context.Context) {
	tick := time.NewTicker(c.heartbeat / 2)
	defer tick.Stop()
	grace := time.Duration(cluster.MissedHeartbeats) * c.heartbeat
	// While this process is cut from NATS it hears no heartbeat: nobody
	// is lost for that; the windows count from the reconnection. The same
	// when this process itself stalled (its tick came a heartbeat late or
	// more: starved of CPU, a long GC): the heartbeats it did not handle
	// meanwhile say nothing of the workers.
	var lastDown time.Time
	lastTick := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		stalled := now.Sub(lastTick) > c.heartbeat
		lastTick = now
		if !c.nc.IsConnected() || !c.ctl.IsConnected() || stalled {
			lastDown = now
			continue
		}
		// A group item whose worker was lost goes back to the stream once
		// its members are decided: if no live worker can hold it, it is
		// taken back.
		c.takeBackUnheldGroups(c.maxSlots())
		// Suspects: workers unheard for their window, and workers holding
		// a claim older than the window that were never heard (since a
		// restart). Each is pinged before it is taken for lost: a worker
		// whose heartbeats are only late (a loaded host) answers.
		suspects := map[string]bool{}
		c.mu.Lock()
		for id, w := range c.workers {
			iv := w.hb.Interval
			if iv <= 0 {
				iv = c.heartbeat
			}
			if now.Sub(later(w.lastSeen, lastDown)) > time.Duration(cluster.MissedHeartbeats)*iv {
				suspects[id] = true
			}
		}
		for _, d := range c.eps {
			if w := d.claim.Worker; w != "" && c.workers[w] == nil && now.Sub(later(d.claimedAt, lastDown)) > grace && !d.ended && !d.deciding {
				suspects[w] = true
			}
		}
		c.mu.Unlock()
		if len(suspects) == 0 {
			continue
		}
		gone := c.unanswered(ctx, suspects)
		if len(gone) == 0 {
			continue
		}
		var lostEps []*dispatched
		c.mu.Lock()
		for _, id := range gone {
			delete(c.workers, id)
		}
		for _, d := range c.eps {
			if slices.Contains(gone, d.claim.Worker) && !d.ended && !d.deciding {
				d.deciding = true
				lostEps = append(lostEps, d)
			}
		}
		c.mu.Unlock()
		c.s.log.Warn("cluster: workers lost (no heartbeat, no answer)", "workers", gone, "attempts", len(lostEps))
		c.resize()
		for _, d := range lostEps {
			go c.lost(d, "its heartbeat stopped and it did not answer", true)
		}
	}
}

// unanswered pings the suspect workers at once and returns those that do
// not answer within a heartbeat interval (at least a second); those that
// do are heard from now.
func (c *coordinator) unanswered(ctx context.Context, suspects map[string]bool) []string {
	timeout := max(c.heartbeat, time.Second)
	var mu sync.Mutex
	var gone []string
	var wg sync.WaitGroup
	for id := range suspects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			_, err := c.ctl.RequestWithContext(pctx, cluster.PingSubject(id), nil)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				c.mu.Lock()
				if w := c.workers[id]; w != nil {
					w.lastSeen = time.Now()
				}
				c.mu.Unlock()
				return
			}
			if ctx.Err() == nil && c.ctl.IsConnected() {
				gone = append(gone, id)
			}
		}()
	}
	wg.Wait()
	sort.Strings(gone)
	return gone
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// cancelRollout tells the workers to stop a rollout's episodes; those no
// worker has claimed end now, unstarted.
func (c *coordinator) cancelRollout(r *rollout, reason, message string) {
	b, _ := json.Marshal(cluster.Cancel{RolloutID: r.id, Reason: reason, Message: message})
	c.nc.Publish(cluster.CancelSubject, b)
	var unclaimed []*dispatched
	c.mu.Lock()
	for _, d := range c.eps {
		if d.j.r == r && d.claim.Worker == "" && !d.ended && !d.deciding {
			d.deciding = true
			unclaimed = append(unclaimed, d)
		}
	}
	c.mu.Unlock()
	for _, d := range unclaimed {
		c.finish(d, unstartedTrajectory(d.j.ep.rec, d.j.ep.task, r.backend, r.rec.Policy, reason, message+" (before a worker took the episode)"))
	}
}

// WorkerInfo is one worker in GET /v1/workers.
type WorkerInfo struct {
	ID       string    `json:"id"`
	Host     string    `json:"host"`
	Backends []string  `json:"backends"`
	Slots    int       `json:"slots"`
	Running  int       `json:"running"`
	LastSeen time.Time `json:"last_seen"`
}

func (c *coordinator) workerList() []WorkerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]WorkerInfo, 0, len(c.workers))
	for _, w := range c.workers {
		out = append(out, WorkerInfo{ID: w.hb.ID, Host: w.hb.Host, Backends: w.hb.Backends, Slots: w.hb.Slots, Running: w.hb.Running, LastSeen: w.lastSeen.UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// waitIdle waits until every dispatched episode has come back, or ctx
// ends; it returns how many had not.
// dispatched counts the episodes out with workers.
func (c *coordinator) dispatched() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.eps)
}

func (c *coordinator) waitIdle(ctx context.Context) int {
	for {
		c.mu.Lock()
		n := len(c.eps)
		c.mu.Unlock()
		if n == 0 || ctx.Err() != nil {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterTasks is, on a coordinator, what its workers need of the tasks
// beyond their JSON (clusterRollout.Tasks; nil when none needs anything):
// the directory of each task's file and each search index's identity.
func (s *Server) clusterTasks(tasks []*agent.Task) ([]clusterTask, error) {
	out := make([]clusterTask, len(tasks))
	needed := false
	for i, t := range tasks {
		out[i].Dir = t.Dir()
		if t.Retriever != nil {
			if s.opts.SearchIndex == nil {
				return nil, badField(fmt.Sprintf("tasks[%d].retriever", i), "this coordinator was opened without its search indexes")
			}
			id, err := s.opts.SearchIndex(t)
			if err != nil {
				return nil, badField(fmt.Sprintf("tasks[%d].retriever", i), "%v", err)
			}
			out[i].Index = id
		}
		needed = needed || out[i] != clusterTask{}
	}
	if !needed {
		return nil, nil
	}
	return out, nil
}

// clusterRefuses refuses what this service cannot run: retry_interrupted
// on a single host (no attempt is lost with a worker there). A coordinator
// runs every task over its workers: a prefix task's group as one group
// item, an orchestrator episode as one item whose sub-agents run on its
// worker within the worker's slots.
func (s *Server) clusterRefuses(req *RolloutRequest, _ []*agent.Task) error {
	if s.coord == nil && req.RetryInterrupted {
		return badField("retry_interrupted", "only a cluster coordinator (rollbox serve --cluster) loses attempts with their workers")
	}
	return nil
}

// getWorkers answers GET /v1/workers: the live workers of a coordinator
// (none on a single host).
func (s *Server) getWorkers(w http.ResponseWriter, r *http.Request) error {
	workers := []WorkerInfo{}
	if s.coord != nil {
		workers = s.coord.workerList()
	}
	writeHTTPJSON(w, http.StatusOK, map[string]any{"workers": workers})
	return nil
}

// resume dispatches again the rollouts a previous coordinator left
// unfinished (those with a cluster record) and returns the others, for the
// single-host recovery. Of each, an episode whose record is written ends
// as it says; one a worker may still hold (its work item is still in the
// stream: not acknowledged, so not stored) is in flight again, with its
// claim and journal as kept on disk; the rest are queued again. Nothing is
// stored twice: a worker's Done for an episode already stored is answered
// "ack", and an item still in the stream is never published again. The
// journal is consumed only once resume has returned.
func (c *coordinator) resume(unfinished []*rolloutRecord) (resumed []string, rest []*rolloutRecord) {
	defer close(c.resumed)
	for _, rr := range unfinished {
		if rr.Cluster == nil || rr.State == RolloutCancelled {
			rest = append(rest, rr)
			continue
		}
		if err := c.resumeRollout(rr); err != nil {
			c.s.log.Error("cluster: a rollout could not be dispatched again; it is recovered as on one host (interrupted)", "rollout", rr.ID, "err", err)
			rest = append(rest, rr)
			continue
		}
		resumed = append(resumed, rr.ID)
	}
	return resumed, rest
}

func (c *coordinator) resumeRollout(rr *rolloutRecord) error {
	s := c.s
	r, err := s.loadRollout(rr.ID)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("rollout %s is not in the store", rr.ID)
	}
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	stream, err := c.js.Stream(ctx, cluster.WorkStream)
	if err != nil {
		return fmt.Errorf("JetStream stream %s: %w", cluster.WorkStream, err)
	}
	cl := rr.Cluster
	wire := cl.Policy
	r.wire, r.retryInterrupted, r.trainStep, r.info = &wire, cl.RetryInterrupted, cl.TrainStep, wire.Info
	if cl.MaxStaleness != nil {
		r.maxStaleness = *cl.MaxStaleness
	}
	r.versions = slices.Clone(cl.Versions)
	for i, ct := range cl.Tasks {
		if i < len(r.tasks) {
			r.tasks[i].SetDir(ct.Dir)
		}
	}
	if rr.Schedule == ScheduleGroups {
		conc := s.limits.PolicyConcurrency
		if m := wire.MaxConcurrency; m > 0 && m < conc {
			conc = m
		}
		r.window = groupWindow(conc, rr.GroupSize)
	}
	plans := map[int]*plan{}
	var queued, inflight []*job
	var ds []*dispatched
	var ended []endedEpisode
	now := time.Now()
	for _, e := range r.episodes {
		if e.rec.State == episodeDone {
			continue
		}
		if t, err := trajectory.Read(s.st.trajectoryPath(e.rec.ID)); err == nil && t.Termination != nil {
			// Stored, not indexed: the process died in between.
			ended = append(ended, endedEpisode{e: e, t: t})
			c.dropClaim(e.rec.ID) // its lines: sweepLines

			continue
		}
		pl := plans[e.rec.TaskIndex]
		if pl == nil {
			if e.task == nil {
				return fmt.Errorf("episode %s: task %d is not in the rollout's record", e.rec.ID, e.rec.TaskIndex)
			}
			pl = newPlan(e.task, r.backend, s.limits.WarmPool)
			plans[e.rec.TaskIndex] = pl
		}
		j := &job{r: r, ep: e, plan: pl}
		subject := cluster.WorkSubject(pl.backend, e.rec.ID)
		if j.groupItem() {
			subject = cluster.GroupWorkSubject(pl.backend, e.rec.GroupID)
		}
		e.group.redispatch = true // a group item published again gets a msg id of its own
		m, err := stream.GetLastMsgForSubject(ctx, subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			queued = append(queued, j)
			continue
		case err != nil:
			return fmt.Errorf("episode %s: looking for its work item: %w", e.rec.ID, err)
		}
		d := &dispatched{j: j, claimedAt: now, published: true}
		if j.groupItem() {
			var item cluster.WorkItem
			if json.Unmarshal(m.Data, &item) == nil {
				d.members = len(item.Members)
			}
		}
		if claim, ok := c.readClaim(e.rec.ID); ok {
			d.claim = claim
		}
		inflight = append(inflight, j)
		ds = append(ds, d)
	}
	r.ctx, r.cancel = context.WithCancelCause(s.ctx)
	r.mu.Lock()
	r.running += len(inflight)
	if len(inflight) > 0 {
		r.rec.State = RolloutRunning
	}
	r.mu.Unlock()
	c.mu.Lock()
	for _, d := range ds {
		c.eps[d.j.ep.rec.ID] = d
	}
	c.mu.Unlock()
	s.mu.Lock()
	s.rollouts[r.id] = r
	s.mu.Unlock()
	s.sched.resume(r, inflight, queued)
	s.metrics.Episodes.WithLabelValues("running").Add(float64(len(inflight)))
	s.metrics.Episodes.WithLabelValues("queued").Add(float64(len(queued)))
	if len(ended) > 0 {
		s.recordEnds(r, ended)
	}
	s.log.Info("cluster: rollout dispatched again after a restart", "rollout", r.id, "in_flight", len(inflight),
		"queued", len(queued), "stored_before", len(ended))
	if len(inflight)+len(queued)+len(ended) == 0 {
		// Every end was indexed: only the rollout's own end was not.
		t := time.Now().UTC()
		r.mu.Lock()
		r.rec.State, r.rec.EndedAt = RolloutDone, &t
		r.mu.Unlock()
		s.saveRollout(r)
	}
	return nil
}

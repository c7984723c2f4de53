// Package cluster is the wire protocol between a coordinator (`rollbox
// serve --cluster nats://HOST:PORT`) and its workers (`rollbox worker
// --cluster nats://HOST:PORT --backend B --slots N`), over NATS JetStream.
//
// # Flow
//
//  1. Dispatch. The coordinator admits a rollout as on one host (validation,
//     the store, the scheduler's fair order); instead of running an episode
//     it publishes a WorkItem on the work-queue stream WorkStream, subject
//     WorkSubject(backend, episode) (msg id: the episode id). Each backend
//     has one durable pull consumer, WorkConsumer(backend), shared by every
//     worker of that backend (a work-queue stream allows one consumer per
//     subject); each worker fetches at most its free slots, so it never holds
//     more than --slots items unacknowledged, and its fetch is ranked by
//     them (WorkFetchOpts): the waiting worker with the most free slots
//     gets the next item.
//
//  2. Claim. Before it runs an item a worker asks the coordinator (core
//     request on ClaimSubject, a Claim) and gets a ClaimReply: run (with the
//     attempt number the journal must carry) or skip (the episode has ended
//     already, e.g. a duplicate after a restart; the worker acks the item and
//     drops it). A redelivered item (its worker died) is decided here: the
//     failed attempt is kept as an infrastructure attempt when it never asked
//     the policy anything, else the episode ends interrupted (or runs again
//     when the rollout says retry_interrupted).
//
//  3. Journal. The worker runs the episode with the same engine as one host
//     and publishes every journal line (the trajectory's own append-only
//     journal: header, sandbox, steps, events, end) as it is written, in
//     order, each waited for until JetStream has it, on LinesSubject(episode)
//     of LinesStream, with the headers below (KindLine). Before the
//     episode's first policy call it publishes KindAsked on
//     JournalSubject(episode) of the work-queue stream JournalStream and
//     waits for JetStream's ack. The coordinator's one durable consumer
//     CoordinatorConsumer takes JournalStream (asked, done, the prefix and
//     sub-agent records); it never consumes the lines: they stay in
//     LinesStream, where it reads an attempt's lines back (those of the
//     attempt's worker and number, by HeaderSeq) when the attempt is lost
//     with its worker or its record did not ride with its Done, and it
//     purges the episode's subject once the episode's record is stored.
//
//  4. Done and store. When the episode has ended the worker publishes
//     KindDone (a Done body, with the final document and its Summary). The
//     coordinator stores that document (or finalises the attempt's lines
//     into the episode's record), indexes it (group statistics, the stream, export as
//     on one host) and only then answers on StoredSubject(worker) with a
//     Stored; the worker acks the work item on Stored (Action "ack"), or
//     naks it for a redelivery when the coordinator keeps the attempt as an
//     infrastructure failure and retries it (Action "retry"). A worker that
//     hears nothing within a few seconds publishes its Done again: the
//     coordinator is idempotent by episode id and attempt.
//
//  5. Heartbeats. Every worker publishes a Heartbeat on
//     HeartbeatSubject(worker) every interval (core NATS), listing what it
//     runs with each item's ack subject. A worker unheard for
//     MissedHeartbeats intervals, and that does not answer a ping on
//     PingSubject(worker), is lost: the coordinator naks its items for an
//     immediate redelivery (or ends them interrupted, see 2). The
//     coordinator lists the live workers at GET /v1/workers.
//
//     Every worker of a backend keeps its items with news (InProgress)
//     every third of the consumer's AckWait as the server holds it,
//     read back at start and every heartbeat. A worker sets the AckWait
//     (its --ack-wait) only when no live worker of the backend answers
//     on AckWaitSubject(backend); one whose --ack-wait differs from the
//     live workers' is refused at start.
//
//  6. Cancel. DELETE /v1/rollouts/{id} publishes a Cancel on CancelSubject;
//     workers stop that rollout's episodes, which end cancelled and are
//     journaled back as usual.
//
//  7. Policy versions. The claim's answer carries the rollout's announced
//     policy versions; an announcement (POST /v1/policy-version) is a
//     Versions request on VersionsSubject. Workers stamp each turn with
//     the last version, pin an episode's first, and end an episode stale
//     beyond the rollout's max_staleness cancelled, as one host does.
//
//  8. Group items. A task with a prefix runs its group on one worker: the
//     coordinator publishes one WorkItem with Members (GroupWorkSubject);
//     the worker takes a slot per member, claims the members together (one
//     Claim with Members: each decided as in 2, none claimed when one must
//     wait), runs the prefix once and each member in a fork of it,
//     journals each as in
//     3 (and the prefix's record, KindPrefix), and acks the item once every
//     member is stored. A lost worker's members are decided one by one as
//     in 2; the item then goes back, and the ended members are skipped.
//     An orchestrator episode is a single item whose sub-agents run on its
//     worker; their records come back as KindSubagent before its KindDone.
//
// Everything published on a stream is durable once JetStream acks it;
// core NATS messages (claims, heartbeats, stored, cancel) are retried by
// their sender or rebuilt from the streams.
package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// Streams, consumers and subjects.
const (
	// WorkStream holds work items until a worker acks them (work-queue
	// retention): subjects WorkSubjectPrefix + backend + "." + token.
	WorkStream        = "ROLLBOX_WORK"
	WorkSubjectPrefix = "rollbox.work."
	// JournalStream holds journal messages until the coordinator acks them
	// (work-queue retention): subjects JournalSubjectPrefix + token.
	JournalStream        = "ROLLBOX_JOURNAL"
	JournalSubjectPrefix = "rollbox.journal."
	// LinesStream holds the journal lines of the episodes in flight
	// (limits retention: the coordinator does not consume them, it reads an
	// attempt's lines back only when it needs them: an attempt lost with its
	// worker, a record too large to ride with its Done) and purges an
	// episode's subject once its record is stored: subjects
	// LinesSubjectPrefix + token.
	LinesStream        = "ROLLBOX_LINES"
	LinesSubjectPrefix = "rollbox.lines."
	// CoordinatorConsumer is the coordinator's durable consumer of
	// JournalStream.
	CoordinatorConsumer = "coordinator"

	// ClaimSubject takes a Claim (core request/reply, queue group
	// CoordinatorQueue) and answers a ClaimReply.
	ClaimSubject = "rollbox.claim"
	// CoordinatorQueue is the queue group of the coordinator's core
	// subscriptions.
	CoordinatorQueue = "rollbox-coordinator"
	// HeartbeatSubjectPrefix + worker id: a Heartbeat (core).
	HeartbeatSubjectPrefix = "rollbox.heartbeat."
	// StoredSubjectPrefix + worker id: a Stored (core), coordinator to worker.
	StoredSubjectPrefix = "rollbox.stored."
	// CancelSubject: a Cancel (core), coordinator to every worker.
	CancelSubject = "rollbox.cancel"
	// PingSubjectPrefix + worker id: a core request (empty body) a live
	// worker answers at once; the coordinator asks it before it takes a
	// worker whose heartbeats stopped for lost.
	PingSubjectPrefix = "rollbox.ping."
	// VersionsSubject takes a Versions (core request), coordinator to
	// every worker, when a policy version is announced to a rollout; each
	// worker answers a VersionsAck.
	VersionsSubject = "rollbox.versions"
	// AckWaitSubjectPrefix + backend: a core request (empty body) every
	// live worker of the backend answers with an AckWaitAnswer. A starting
	// worker asks it before it touches the backend's work queue consumer.
	AckWaitSubjectPrefix = "rollbox.ackwait."
)

// Journal message headers (every message on JournalStream and
// LinesStream carries them).
const (
	HeaderEpisode = "Rollbox-Episode"
	HeaderRollout = "Rollbox-Rollout"
	HeaderWorker  = "Rollbox-Worker"
	// HeaderAttempt is the attempt number the claim gave.
	HeaderAttempt = "Rollbox-Attempt"
	// HeaderKind is KindLine, KindAsked or KindDone.
	HeaderKind = "Rollbox-Kind"
	// HeaderSeq numbers an attempt's journal lines from 0 (KindLine); on
	// KindDone it is the number of lines the attempt journaled (all in
	// LinesStream before the Done is published).
	HeaderSeq = "Rollbox-Seq"
	// HeaderRecord, on KindDone, is the length in bytes of the episode's
	// final document (as the worker's trajectory writer wrote it from the
	// same lines) that follows the Done and a newline in the body: the
	// coordinator stores it as it is instead of rebuilding it from the
	// journal. Absent (a record over MaxRecordInDone, or none): the
	// coordinator rebuilds the record from the journal.
	HeaderRecord = "Rollbox-Record"
)

// MaxRecordInDone is the largest final document a worker sends with its
// Done (NATS's default max payload is 1 MiB).
const MaxRecordInDone = 512 << 10

// Journal message kinds.
const (
	// KindLine: the body is one journal line, as trajectory.Writer writes
	// it; published on LinesSubject (LinesStream), not on JournalStream.
	KindLine = "line"
	// KindAsked: the episode is about to ask the policy for the first time
	// (empty body). From then on a lost attempt is not re-run silently.
	KindAsked = "asked"
	// KindDone: the attempt ended; the body is a Done.
	KindDone = "done"
	// KindPrefix: the final document of the prefix episode a group item
	// ran (HeaderEpisode is the prefix's id, <group>.prefix[.N]); the
	// coordinator keeps it under DATA/prefixes as one host does.
	KindPrefix = "prefix"
	// KindSubagent: the final document of a sub-agent an orchestrator
	// episode ran (HeaderSubagent is its id, <episode>.s<stage>-<i>), sent
	// before the episode's KindDone; the coordinator keeps it beside the
	// episode's record (DATA/episodes/subagents/), as one host does.
	KindSubagent = "subagent"
)

// HeaderSubagent, on KindSubagent, names the sub-agent.
const HeaderSubagent = "Rollbox-Subagent"

// Claim decisions and stored actions.
const (
	DecisionRun  = "run"
	DecisionSkip = "skip"
	// DecisionWait: the coordinator cannot decide yet (it is starting);
	// nak the item with a delay.
	DecisionWait = "wait"

	ActionAck   = "ack"
	ActionRetry = "retry"
	// ActionDrop: the attempt is no longer the episode's (its worker was
	// taken for lost and the episode decided without it): leave the item.
	ActionDrop = "drop"
)

// MissedHeartbeats is how many heartbeat intervals a worker may stay
// unheard before the coordinator takes it for lost.
const MissedHeartbeats = 3

// DefaultHeartbeat is the default heartbeat interval.
const DefaultHeartbeat = time.Second

// Token encodes an episode id as one subject token (base64url, unpadded):
// episode ids hold dots and whatever a task id holds.
func Token(episodeID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(episodeID))
}

// EpisodeOfToken is the episode id a Token encodes.
func EpisodeOfToken(token string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	return string(b), err
}

// WorkSubject is the subject of an episode's work item.
func WorkSubject(backend, episodeID string) string {
	return WorkSubjectPrefix + backend + "." + Token(episodeID)
}

// WorkFilter is what a backend's consumer takes.
func WorkFilter(backend string) string { return WorkSubjectPrefix + backend + ".>" }

// WorkConsumer names a backend's durable consumer of WorkStream.
func WorkConsumer(backend string) string { return "work-" + backend }

// JournalSubject is the subject of an episode's journal messages but its
// lines.
func JournalSubject(episodeID string) string { return JournalSubjectPrefix + Token(episodeID) }

// LinesSubject is the subject of an episode's journal lines (LinesStream).
func LinesSubject(episodeID string) string { return LinesSubjectPrefix + Token(episodeID) }

// HeartbeatSubject is where a worker announces itself.
func HeartbeatSubject(worker string) string { return HeartbeatSubjectPrefix + worker }

// PingSubject is where a worker answers pings.
func PingSubject(worker string) string { return PingSubjectPrefix + worker }

// AckWaitSubject is where the live workers of a backend say the ack wait
// they keep their items by.
func AckWaitSubject(backend string) string { return AckWaitSubjectPrefix + backend }

// StoredSubject is where the coordinator tells a worker an attempt is stored.
func StoredSubject(worker string) string { return StoredSubjectPrefix + worker }

// WorkItem is one admitted episode to run, or (Members set) a group of
// episodes one worker runs together: a task with a prefix, whose episodes
// fork from the one sandbox that ran it.
type WorkItem struct {
	// EpisodeID and GroupIndex name the episode (empty for a group item).
	EpisodeID  string `json:"episode_id,omitempty"`
	RolloutID  string `json:"rollout_id"`
	GroupID    string `json:"group_id"`
	GroupIndex int    `json:"group_index"`
	TaskIndex  int    `json:"task_index"`
	// Task is the task as run (defaults and overrides applied).
	Task json.RawMessage `json:"task"`
	// Backend is the sandbox backend the task runs on.
	Backend string `json:"backend"`
	Policy  Policy `json:"policy"`
	// TrainStep is the rollout's train_step.
	TrainStep int64 `json:"train_step,omitempty"`
	// TaskDir is the directory of the task file the coordinator read the
	// task from (absent for a task sent inline): its relative workspace
	// and retriever.index paths resolve there, on the worker as on the
	// coordinator's host.
	TaskDir string `json:"task_dir,omitempty"`
	// Index, for a search task, is the identity of the index the
	// coordinator's host opened at retriever.index (IndexIdentity): a worker
	// runs the episode only on the same index.
	Index string `json:"index,omitempty"`
	// MaxStaleness is the rollout's max_staleness (absent: none): an
	// episode whose first turn was sampled under a version more than this
	// many announcements old ends cancelled, as on one host.
	MaxStaleness *int `json:"max_staleness,omitempty"`
	// Members, on a group item (subject GroupWorkSubject, msg id
	// GroupMsgID), are the group's episodes still to run: the worker takes
	// a slot for each (or leaves the item to a worker with room), claims
	// each as an episode of its own, runs them with the single-host engine
	// (the prefix once, each member a fork of it), journals each, and acks
	// the item once every member is stored.
	Members []Member `json:"members,omitempty"`
}

// Member is one episode of a group item.
type Member struct {
	EpisodeID  string `json:"episode_id"`
	GroupIndex int    `json:"group_index"`
}

// GroupWorkSubject is the subject of a group item.
func GroupWorkSubject(backend, groupID string) string { return WorkSubject(backend, "group:"+groupID) }

// GroupMsgID is a group item's JetStream msg id.
func GroupMsgID(groupID string) string { return "group:" + groupID }

// Policy is the rollout's policy as the worker calls it. The API key is
// the worker's own (its environment), never sent on the wire.
type Policy struct {
	BaseURL     string          `json:"base_url"`
	Model       string          `json:"model"`
	Mode        string          `json:"mode,omitempty"`
	TokenizeURL string          `json:"tokenize_url,omitempty"`
	Sampling    json.RawMessage `json:"sampling,omitempty"`
	// MaxRetries is the client's retries (-1: none; 0: the default).
	MaxRetries int     `json:"max_retries,omitempty"`
	TimeoutS   float64 `json:"timeout_s,omitempty"`
	// MaxConcurrency is the rollout's own cap on policy calls in flight,
	// applied per worker (0: none).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// Info is what the trajectory records of the policy.
	Info trajectory.Policy `json:"info"`
}

// Claim asks whether a delivered work item may run.
type Claim struct {
	// EpisodeID is the episode claimed (empty for a group item's claim).
	EpisodeID string `json:"episode_id"`
	Worker    string `json:"worker"`
	// Delivery is JetStream's delivery count of the item (1: first).
	Delivery uint64 `json:"delivery"`
	// AckSubject is the item's reply subject: the coordinator may nak or
	// terminate it itself when the worker is lost.
	AckSubject string `json:"ack_subject"`
	// Members, for a group item, are its episodes, claimed together: the
	// coordinator claims none of them unless it can answer each now (run
	// or skip); when one must wait it answers wait for the group, nothing
	// claimed, so a member never runs alone nor is an attempt counted of
	// a member that never ran.
	Members []string `json:"members,omitempty"`
}

// ClaimReply answers a Claim.
type ClaimReply struct {
	Decision string `json:"decision"`
	Attempt  int    `json:"attempt,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Versions are the rollout's announced policy versions so far, oldest
	// first (with run): the worker stamps each turn with the last one and
	// keeps them up to date from VersionsSubject.
	Versions []string `json:"versions,omitempty"`
	// Members answers a group item's claim (with run), one per member in
	// the claim's order: run (with its attempt and versions) or skip.
	Members []ClaimReply `json:"members,omitempty"`
}

// Done ends an attempt (the body of a KindDone journal message).
type Done struct {
	// InfraFailure is set when the episode's open failed for the
	// infrastructure's sake before the policy was asked anything
	// (agent.OpenError.Infra): the coordinator may retry it.
	InfraFailure bool `json:"infra_failure,omitempty"`
	// Error is what failed, when something did.
	Error string `json:"error,omitempty"`
	// Summary, when the final document rides with the Done, is what the
	// coordinator indexes of it, decoded by the worker from that document:
	// the coordinator then stores the document as it is and decodes none.
	Summary *Summary `json:"summary,omitempty"`
}

// Summary is what a coordinator indexes of an episode's final document
// (group statistics, the rollout's counts, metrics).
type Summary struct {
	EpisodeID   string                  `json:"episode_id"`
	Termination *trajectory.Termination `json:"termination"`
	Reward      *trajectory.Reward      `json:"reward"`
	Stats       trajectory.Stats        `json:"stats"`
	Monitors    *trajectory.Monitors    `json:"monitors,omitempty"`
}

// Trajectory is the summary as a trajectory holding only those fields.
func (s *Summary) Trajectory() *trajectory.Trajectory {
	return &trajectory.Trajectory{EpisodeID: s.EpisodeID, Termination: s.Termination, Reward: s.Reward, Stats: s.Stats, Monitors: s.Monitors}
}

// Stored tells a worker the coordinator holds an attempt's outcome.
type Stored struct {
	EpisodeID string `json:"episode_id"`
	Attempt   int    `json:"attempt"`
	// Action is ActionAck (the record is stored: ack the item) or
	// ActionRetry (kept as an infrastructure attempt: nak it).
	Action string `json:"action"`
}

// Heartbeat announces a worker.
type Heartbeat struct {
	ID       string   `json:"id"`
	Host     string   `json:"host"`
	Backends []string `json:"backends"`
	Slots    int      `json:"slots"`
	Running  int      `json:"running"`
	// Interval is the worker's heartbeat interval.
	Interval time.Duration `json:"interval"`
	// Episodes are the attempts it runs.
	Episodes []Running `json:"episodes,omitempty"`
	// Leaving is set by a worker that stops cleanly (its items are nak'ed).
	Leaving bool `json:"leaving,omitempty"`
}

// AckWaitAnswer is a worker's answer on AckWaitSubject: the ack wait of
// its backend's work queue consumer it keeps its items by (it sends
// InProgress every third of it). A worker still starting answers with its
// --ack-wait.
type AckWaitAnswer struct {
	Worker   string        `json:"worker"`
	Host     string        `json:"host"`
	Instance string        `json:"instance"`
	AckWait  time.Duration `json:"ack_wait"`
}

// Running is one attempt a worker runs.
type Running struct {
	EpisodeID  string `json:"episode_id"`
	Attempt    int    `json:"attempt"`
	AckSubject string `json:"ack_subject"`
	Asked      bool   `json:"asked,omitempty"`
}

// IndexIdentity names a search index by what it holds and how it was
// built: its corpus's sha256, the units indexed, the chunk size and the
// scoring. Two hosts run the same searches alike on indexes of one
// identity.
func IndexIdentity(corpusSHA256 string, units, chunkTokens int, scoring string) string {
	return fmt.Sprintf("sha256:%s units:%d chunk_tokens:%d scoring:%s", corpusSHA256, units, chunkTokens, scoring)
}

// Versions tells the workers a rollout's policy versions after an
// announcement (the whole list, oldest first: a worker keeps the longer of
// what it has and what it hears). A worker cancels the episodes of the
// rollout it runs that are now stale (max_staleness) and answers a
// VersionsAck.
type Versions struct {
	RolloutID string   `json:"rollout_id"`
	Versions  []string `json:"versions"`
}

// VersionsAck answers a Versions: how many episodes the worker cancelled
// as stale.
type VersionsAck struct {
	Worker    string `json:"worker"`
	Cancelled int    `json:"cancelled"`
}

// Cancel stops a rollout's episodes on every worker.
type Cancel struct {
	RolloutID string `json:"rollout_id"`
	Reason    string `json:"reason"`
	Message   string `json:"message,omitempty"`
}

package cluster

import (
	"context"
	"fmt"
	"math/bits"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// CheckURL checks a --cluster value: a nats:// (or tls://) URL with a host.
func CheckURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
		return fmt.Errorf("--cluster %q is not a nats://HOST:PORT URL", s)
	}
	return nil
}

// Connect connects to the NATS server at url as name, reconnecting for
// ever (a restarted NATS server is found again; publishes made meanwhile
// are buffered by the client or retried by their callers).
func Connect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	if err := CheckURL(url); err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(false), nats.ReconnectBufSize(64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream at %s: %w", url, err)
	}
	return nc, js, nil
}

// EnsureStreams creates (or updates) WorkStream and JournalStream (file
// storage, work-queue retention, duplicate window for the work items' msg
// ids) and LinesStream (file storage, kept until the coordinator purges an
// episode's subject). The coordinator calls it at start; a worker too, so either may
// start first.
func EnsureStreams(ctx context.Context, js jetstream.JetStream) error {
	for _, cfg := range []jetstream.StreamConfig{
		{Name: WorkStream, Subjects: []string{WorkSubjectPrefix + ">"}, Retention: jetstream.WorkQueuePolicy,
			Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute},
		{Name: JournalStream, Subjects: []string{JournalSubjectPrefix + ">"}, Retention: jetstream.WorkQueuePolicy,
			Storage: jetstream.FileStorage},
		{Name: LinesStream, Subjects: []string{LinesSubjectPrefix + ">"}, Retention: jetstream.LimitsPolicy,
			Storage: jetstream.FileStorage},
	} {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("JetStream stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// AckWait is the default of how long a work item stays with a worker
// without news before JetStream redelivers it (a worker's --ack-wait);
// workers send InProgress every third of it.
const AckWait = 30 * time.Second

// WorkConsumerConfig is a backend's shared durable pull consumer, whose
// items are redelivered after ackWait without news (AckWait when 0). Its
// pull requests are served by priority (WorkFetchOpts): of the workers
// waiting for work, the one with the most free slots gets an item first.
func WorkConsumerConfig(backend string, ackWait time.Duration) jetstream.ConsumerConfig {
	if ackWait <= 0 {
		ackWait = AckWait
	}
	return jetstream.ConsumerConfig{Durable: WorkConsumer(backend), FilterSubject: WorkFilter(backend),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 1 << 20,
		MaxWaiting: 4096, DeliverPolicy: jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPrioritized, PriorityGroups: []string{WorkPriorityGroup}}
}

// WorkPriorityGroup is the priority group of the work consumers' pull
// requests.
const WorkPriorityGroup = "free-slots"

// WorkFetchOpts are the options of a worker's fetch of up to free items
// (its free slots): the pull request is ranked by free slots, a class per
// power of two (1, 2-3, 4-7, ..., 512 and more: priorities 9 down to 0).
//
// # Notes
//
// JetStream gives an item, a redelivered one too, to the oldest waiting
// pull request of the best priority. Without ranking, a group item naked
// by a worker too small for it (it naks it with a delay) went to whichever
// worker's request was oldest when the delay ended, and workers re-pull
// every second: with the phases of the workers' fetch loops fixed, the same
// small worker got it each time, for minutes, while a worker with room
// waited (TestAGroupItemGoesToTheWaitingWorkerWithRoom). Ranked, a worker
// with a free slot for each of a group's episodes (a power of two) is
// served before any with fewer. A worker that does not send the group
// (an older one) ranks last; a consumer made without priorities (by an
// older worker) ignores the rank.
func WorkFetchOpts(free int) []jetstream.FetchOpt {
	class := bits.Len(uint(max(free, 1))) - 1
	return []jetstream.FetchOpt{jetstream.FetchPriorityGroup(WorkPriorityGroup), jetstream.FetchPrioritized(uint8(9 - min(class, 9)))}
}

// JournalAckWait is how long a journal message delivered to the
// coordinator and not acknowledged (lost with a connection) waits before
// it is delivered again: the coordinator holds back an episode's later
// lines until the missing one is back.
const JournalAckWait = 5 * time.Second

// JournalConsumerConfig is the coordinator's durable consumer of the
// journal stream. A starting coordinator makes it anew (everything not
// acknowledged is then delivered again, in order).
func JournalConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{Durable: CoordinatorConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: JournalAckWait, MaxDeliver: -1, MaxAckPending: 1 << 20, DeliverPolicy: jetstream.DeliverAllPolicy}
}

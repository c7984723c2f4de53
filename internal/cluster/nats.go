package cluster

import (
	"context"
	"fmt"
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
// items are redelivered after ackWait without news (AckWait when 0).
func WorkConsumerConfig(backend string, ackWait time.Duration) jetstream.ConsumerConfig {
	if ackWait <= 0 {
		ackWait = AckWait
	}
	return jetstream.ConsumerConfig{Durable: WorkConsumer(backend), FilterSubject: WorkFilter(backend),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 1 << 20,
		MaxWaiting: 4096, DeliverPolicy: jetstream.DeliverAllPolicy}
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

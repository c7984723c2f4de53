// Package natstest starts a real NATS JetStream server inside a test's
// process, for tests of the coordinator and its workers that need no
// server restart (internal/cluster starts its own, restartable, on a
// fixed port).
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs an embedded JetStream server on a free local port, its store
// in a temp dir of t, and shuts it down when t ends. It fails t when the
// server does not start within 10 s.
func Start(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("the embedded NATS server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

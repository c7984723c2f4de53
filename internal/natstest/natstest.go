// Package natstest starts a real NATS JetStream server, and a rollout
// service coordinating over it, inside a test's process, for tests of the
// coordinator and its workers that need no server restart
// (internal/cluster starts its own, restartable, on a fixed port, and
// coordinators as processes).
package natstest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
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

// Coordinator opens a rollout service on data in this process as the
// coordinator of the cluster co names (it runs no episode: its backends refuse to
// open), waits for its recovery and serves its API on a local HTTP server
// whose URL it returns. Both are closed when t ends, before a server of
// Start registered earlier stops.
func Coordinator(t testing.TB, data string, co *runtime.ClusterOptions, log *slog.Logger) (*runtime.Server, string) {
	t.Helper()
	srv, err := runtime.Open(runtime.Options{DataDir: data, Registry: prometheus.NewRegistry(), Logger: log, Cluster: co,
		Backends: runtime.BackendFunc(func(_ context.Context, name string) (sandbox.Backend, error) {
			return nil, fmt.Errorf("a coordinator opens no backend (%s): %w", name, sandbox.ErrEngineUnavailable)
		})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := srv.Recovered(ctx); err != nil {
		srv.Shutdown(ctx)
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
	})
	return srv, hs.URL
}

package runtime

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// HTTPTimeouts bound what one client connection may hold of the service.
// Zero fields take the defaults.
type HTTPTimeouts struct {
	// ReadHeader bounds reading a request's headers (default 10 s).
	ReadHeader time.Duration
	// Read bounds reading a whole request, body included (default 60 s): a
	// client that sends less than its Content-Length, or trickles it, is cut
	// off instead of holding a connection forever. Streams and exports lift
	// it once their request is read.
	Read time.Duration
	// Write bounds writing an answer (default 60 s); a stream or an export
	// renews it at every write, so a long stream lives while its reader
	// reads, and a reader that stops is cut off.
	Write time.Duration
	// Idle bounds a kept-alive connection between requests (default 2 min).
	Idle time.Duration
}

func (t HTTPTimeouts) withDefaults() HTTPTimeouts {
	if t.ReadHeader <= 0 {
		t.ReadHeader = 10 * time.Second
	}
	if t.Read <= 0 {
		t.Read = 60 * time.Second
	}
	if t.Write <= 0 {
		t.Write = 60 * time.Second
	}
	if t.Idle <= 0 {
		t.Idle = 2 * time.Minute
	}
	return t
}

// HTTPServer is an http.Server for Handler with the service's timeouts
// (Options.HTTP). Serve it, and Shutdown the service when it stops.
func (s *Server) HTTPServer() *http.Server {
	t := s.opts.HTTP
	return &http.Server{Handler: s.Handler(), ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, IdleTimeout: t.Idle,
		MaxHeaderBytes: 64 << 10, ConnContext: acceptedAt}
}

// accepted is when the server's accept loop took a connection, and the
// connection, for the first request on it (GET /healthz's Server-Timing).
type accepted struct {
	at   time.Time
	conn net.Conn
	used atomic.Bool
}

type acceptedKey struct{}

// acceptedAt is the http.Server's ConnContext: it notes when the
// connection was accepted.
func acceptedAt(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, acceptedKey{}, &accepted{at: time.Now(), conn: c})
}

// inService is how long the first request on a connection the service
// accepted itself (not one of its tests' servers) has been the service's:
// since its bytes reached this host's socket (TCP_INFO's last_data_recv,
// in ms: the wait in the kernel's queue for the accept loop and the read
// counts), or since the accept when that is longer or unknown; and since
// the accept alone. False for a later request on a kept-alive connection.
func inService(r *http.Request) (service, sinceAccept time.Duration, ok bool) {
	a, _ := r.Context().Value(acceptedKey{}).(*accepted)
	if a == nil || a.used.Swap(true) {
		return 0, 0, false
	}
	sinceAccept = time.Since(a.at)
	service = max(sinceAccept, sinceDataArrived(a.conn))
	return service, sinceAccept, true
}

// longAnswer prepares a handler whose answer may take long to write (a
// stream, an export): the read deadline is lifted (the request has been
// read; a deadline left on the connection would cancel the request's
// context when it passes) and writes go through a writer that renews the
// write deadline at every write.
func (s *Server) longAnswer(w http.ResponseWriter) *deadlineWriter {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	return &deadlineWriter{w: w, rc: rc, d: s.opts.HTTP.Write}
}

// deadlineWriter renews a response's write deadline before every write.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
	d  time.Duration
}

func (dw *deadlineWriter) Write(p []byte) (int, error) {
	dw.rc.SetWriteDeadline(time.Now().Add(dw.d))
	return dw.w.Write(p)
}

// Flush sends what is buffered, under a renewed deadline.
func (dw *deadlineWriter) Flush() error {
	dw.rc.SetWriteDeadline(time.Now().Add(dw.d))
	return dw.rc.Flush()
}

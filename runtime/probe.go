package runtime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/rollbox/rollbox/internal/promptnet"
)

// PromptListener wraps ln as rollbox serve listens: while the service is
// busy, new connections are looked for every every from a timer's
// goroutine (internal/promptnet), which answers a GET /healthz itself
// (AnswerProbe) and hands every other connection to the HTTP server.
func (s *Server) PromptListener(ln *net.TCPListener, every time.Duration) (*promptnet.Listener, error) {
	return promptnet.Listen(ln, every, s.Busy, s.AnswerProbe)
}

// AnswerProbe answers a GET /healthz the prompt listener's goroutine read
// (promptnet.Answer) with what the HTTP route would answer: the same body,
// status and Server-Timing, and Connection: close. The goroutine does no
// I/O but the probe's own socket and takes no lock (health reads atomics),
// so the answer does not wait for the HTTP server's goroutines to be
// scheduled among the episodes'. A request the route would refuse or that
// is not a plain GET /healthz (a body, an upgrade, a host not allowed, a
// browser's) is not taken: the HTTP server answers it as before.
func (s *Server) AnswerProbe(p promptnet.Probe) ([]byte, bool) {
	if !bytes.HasPrefix(p.Request, []byte("GET /healthz")) {
		return nil, false
	}
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(p.Request)))
	if err != nil || r.Method != http.MethodGet || r.URL.Path != "/healthz" || r.ContentLength != 0 ||
		len(r.TransferEncoding) > 0 || r.Header.Get("Upgrade") != "" {
		return nil, false
	}
	if _, err := s.guard(r, true); err != nil {
		return nil, false
	}
	h, status := s.health()
	body, err := json.Marshal(h)
	if err != nil {
		return nil, false
	}
	body = append(body, '\n')
	sinceAccept := time.Since(p.Accepted)
	service := max(sinceAccept, p.DataAge)
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nDate: %s\r\n"+
		"Server-Timing: %s\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), len(body), time.Now().UTC().Format(http.TimeFormat), serverTiming(service, sinceAccept))
	b.Write(body)
	s.metrics.HTTPRequests.WithLabelValues("GET /healthz", strconv.Itoa(status)).Inc()
	return b.Bytes(), true
}

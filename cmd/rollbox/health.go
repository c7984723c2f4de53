package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/runtime"
)

// A health snapshot goes from rollbox serve to its health responder as one
// JSON line on the responder's stdin, every healthEvery.
const healthEvery = 250 * time.Millisecond

type healthSnapshot struct {
	Code int             `json:"code"`
	Body json.RawMessage `json:"body"`
}

// newServeHealthCmd is the hidden `rollbox healthd`: the /healthz
// responder `rollbox serve --health-addr` runs in a process of its own. The
// service's own /healthz shares its process with thousands of episode
// goroutines, and Go's scheduler has no priorities: under a burst a probe
// waits its turn behind them. This process has nothing else to do, so a
// probe is answered in a few milliseconds whatever the load; and since it
// answers from the last snapshot the service sent (one a 250 ms), a service
// that stops sending (hung, or starved for seconds) is reported
// "unresponsive" with a 503 — what a liveness probe is for.
func newServeHealthCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:    "healthd --addr HOST:PORT",
		Short:  "Answer /healthz for rollbox serve --health-addr (run by it)",
		Hidden: true,
		Args:   noArgs,
	}
	addr := cmd.Flags().String("addr", "127.0.0.1:0", "`HOST:PORT` to listen on")
	stale := cmd.Flags().Duration("stale", 5*time.Second, "report the service unresponsive when its last snapshot is older than this")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", *addr, err)
		}
		type latest struct {
			snap healthSnapshot
			at   time.Time
		}
		var cur atomic.Pointer[latest]
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			l := cur.Load()
			if l == nil || time.Since(l.at) > *stale {
				since := "it started"
				if l != nil {
					since = fmt.Sprintf("%.1f s", time.Since(l.at).Seconds())
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, `{"status":"unresponsive","problems":["the service has not reported its health for %s"]}`+"\n", since)
				return
			}
			w.WriteHeader(l.snap.Code)
			w.Write(append(l.snap.Body, '\n'))
		})
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
		go hs.Serve(ln)
		fmt.Fprintf(env.stdout, "health listening on http://%s\n", ln.Addr())
		// Until the service closes our stdin (it stopped, or died).
		sc := bufio.NewScanner(env.stdin)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var s healthSnapshot
			if json.Unmarshal(sc.Bytes(), &s) == nil && s.Code != 0 {
				cur.Store(&latest{snap: s, at: time.Now()})
			}
		}
		hs.Close()
		return nil
	}
	return cmd
}

var healthListeningRe = regexp.MustCompile(`health listening on (http://\S+)`)

// startHealthResponder runs `rollbox healthd` on addr and feeds it the
// service's health every healthEvery until stop; it reports the service
// unresponsive when no snapshot came for stale. It returns the responder's
// URL.
func startHealthResponder(env *cliEnv, addr string, stale time.Duration, srv *runtime.Server, log *slog.Logger) (url string, stop func(), err error) {
	cmd, in, out, err := startChild(env, "healthd", "--addr", addr, "--stale", stale.String())
	if err != nil {
		return "", nil, err
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := healthListeningRe.FindStringSubmatch(sc.Text()); m != nil {
				first <- m[1]
			}
		}
		close(first)
	}()
	select {
	case url = <-first:
	case <-time.After(30 * time.Second):
	}
	if url == "" {
		cmd.Process.Kill()
		cmd.Wait()
		return "", nil, fmt.Errorf("the health responder (%s healthd) did not start listening on %s", cmd.Path, addr)
	}
	done := make(chan struct{})
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		tick := time.NewTicker(healthEvery)
		defer tick.Stop()
		for {
			h, code := srv.Health()
			body, _ := json.Marshal(h)
			line, _ := json.Marshal(healthSnapshot{Code: code, Body: body})
			if _, err := in.Write(append(line, '\n')); err != nil {
				if !errors.Is(err, os.ErrClosed) {
					log.Error("the health responder went away: /healthz on the health address no longer answers", "err", err)
				}
				return
			}
			select {
			case <-done:
				return
			case <-tick.C: // through the shutdown too: it reports shutting_down
			}
		}
	}()
	return url, func() {
		close(done)
		<-fed
		in.Close()
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case <-waited:
		case <-time.After(2 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
	}, nil
}

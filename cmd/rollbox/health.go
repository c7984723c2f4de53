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
	"os/signal"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
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
		// Its stdout's reader goes with the image of the service that
		// started it (--recycle-above): a write there must fail, not kill.
		signal.Ignore(syscall.SIGPIPE)
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

// healthResponder is a running `rollbox healthd` and the goroutine that
// feeds it the service's health.
type healthResponder struct {
	url  string
	pid  int
	in   *os.File // its stdin's write end
	wait func() error
	kill func() error
	done chan struct{}
	fed  chan struct{}
}

// The variables of the environment by which a service that executes itself
// again (--recycle-above) hands its health responder over to the next
// image: the descriptor of the responder's stdin, its process id and URL.
const (
	healthFDEnv  = "ROLLBOX_HEALTH_FD"
	healthPIDEnv = "ROLLBOX_HEALTH_PID"
	healthURLEnv = "ROLLBOX_HEALTH_URL"
)

// startHealthResponder runs `rollbox healthd` on addr, or takes over the one
// a previous image of this process handed over, and feeds it the service's
// health every healthEvery until Stop; it reports the service unresponsive
// when no snapshot came for stale.
func startHealthResponder(env *cliEnv, addr string, stale time.Duration, srv *runtime.Server, log *slog.Logger) (*healthResponder, error) {
	if r := adoptedHealthResponder(); r != nil {
		r.feed(srv, log)
		return r, nil
	}
	cmd, err := env.command("healthd", "--addr", addr, "--stale", stale.String())
	if err != nil {
		return nil, err
	}
	// No parent-death signal: the kernel sends it when the thread that
	// started the child ends, as every thread but one does when this
	// process executes itself again. The responder ends when its stdin
	// does, which the kernel closes when this process dies.
	cmd.Stderr = os.Stderr
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdin = pr
	out, err := cmd.StdoutPipe()
	if err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	err = cmd.Start()
	pr.Close()
	if err != nil {
		pw.Close()
		return nil, err
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
	var url string
	select {
	case url = <-first:
	case <-time.After(30 * time.Second):
	}
	if url == "" {
		pw.Close()
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("the health responder (%s healthd) did not start listening on %s", cmd.Path, addr)
	}
	r := &healthResponder{url: url, pid: cmd.Process.Pid, in: pw, wait: cmd.Wait, kill: cmd.Process.Kill}
	r.feed(srv, log)
	return r, nil
}

// handedHealth is the responder this image handed over (handOver): taken
// back as it is when the next image could not be executed, so that its
// stdin has one *os.File (whose finalizer would close it).
var handedHealth *healthResponder

// adoptedHealthResponder is the responder a previous image of this process
// (or this image, when it could not execute the next) handed over, or nil.
func adoptedHealthResponder() *healthResponder {
	fdv, ok := os.LookupEnv(healthFDEnv)
	pidv, url := os.Getenv(healthPIDEnv), os.Getenv(healthURLEnv)
	for _, k := range []string{healthFDEnv, healthPIDEnv, healthURLEnv} {
		os.Unsetenv(k)
	}
	if r := handedHealth; r != nil {
		handedHealth = nil
		syscall.CloseOnExec(int(r.in.Fd()))
		return r
	}
	if !ok {
		return nil
	}
	fd, err1 := strconv.Atoi(fdv)
	pid, err2 := strconv.Atoi(pidv)
	if err1 != nil || err2 != nil || fd < 3 || pid <= 0 {
		return nil
	}
	syscall.CloseOnExec(fd)
	p, err := os.FindProcess(pid) // a child of this process: the previous image started it
	if err != nil {
		return nil
	}
	return &healthResponder{url: url, pid: pid, in: os.NewFile(uintptr(fd), "health responder's stdin"),
		wait: func() error { _, err := p.Wait(); return err }, kill: p.Kill}
}

// feed sends the service's health to the responder every healthEvery
// until stopFeeding.
func (r *healthResponder) feed(srv *runtime.Server, log *slog.Logger) {
	r.done, r.fed = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.fed)
		tick := time.NewTicker(healthEvery)
		defer tick.Stop()
		for {
			h, code := srv.Health()
			body, _ := json.Marshal(h)
			line, _ := json.Marshal(healthSnapshot{Code: code, Body: body})
			if _, err := r.in.Write(append(line, '\n')); err != nil {
				if !errors.Is(err, os.ErrClosed) {
					log.Error("the health responder went away: /healthz on the health address no longer answers", "err", err)
				}
				return
			}
			select {
			case <-r.done:
				return
			case <-tick.C: // through the shutdown too: it reports shutting_down
			}
		}
	}()
}

func (r *healthResponder) stopFeeding() {
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	<-r.fed
}

// Stop ends the responder: its stdin closed, it is killed if it has not
// exited within 2 s.
func (r *healthResponder) Stop() {
	r.stopFeeding()
	r.in.Close()
	waited := make(chan error, 1)
	go func() { waited <- r.wait() }()
	select {
	case <-waited:
	case <-time.After(2 * time.Second):
		r.kill()
		<-waited
	}
}

// handOver stops feeding the responder, which keeps answering with the last
// snapshot (the service's idle "ok") for its --stale, and leaves it to the
// next image of this process: its stdin kept open across exec, where to
// find it in the environment.
func (r *healthResponder) handOver() error {
	r.stopFeeding()
	if err := keepAcrossExec(r.in); err != nil {
		return err
	}
	fd := r.in.Fd()
	os.Setenv(healthFDEnv, strconv.Itoa(int(fd)))
	os.Setenv(healthPIDEnv, strconv.Itoa(r.pid))
	os.Setenv(healthURLEnv, r.url)
	handedHealth = r
	return nil
}

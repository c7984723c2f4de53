package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/internal/proc"
)

// Service is `rollbox serve` run in a child process by the bench, so the
// service's peak RSS and CPU time are its own.
type Service struct {
	// URL is where it listens.
	URL string
	// HealthURL is its separate health responder's /healthz, when it was
	// started with --health-addr.
	HealthURL string
	// DebugURL is where it serves Go's profiles, when it was started with
	// --debug-addr.
	DebugURL  string
	debugAddr chan string
	cmd       *exec.Cmd
	logf      *os.File
	waited    chan error
}

var (
	listeningRe = regexp.MustCompile(`"listening on (http://\S+)`)
	healthRe    = regexp.MustCompile(`"health responder on (http://\S+)`)
	debugRe     = regexp.MustCompile(`"serving Go's profiles","addr":"([^"]+)"`)
)

// StartService runs `exe serve` on dataDir/data with flags (and an address
// it picks), its log in dataDir/serve.log, and waits until it listens.
func StartService(ctx context.Context, exe, dataDir string, flags []string) (*Service, error) {
	logf, err := os.Create(filepath.Join(dataDir, "serve.log"))
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", filepath.Join(dataDir, "data")}, flags...)
	cmd := exec.Command(exe, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Service{cmd: cmd, logf: logf, waited: make(chan error, 1), debugAddr: make(chan string, 1)}
	found := make(chan string, 1)
	health := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := healthRe.FindStringSubmatch(line); m != nil {
				health <- m[1]
			}
			if m := debugRe.FindStringSubmatch(line); m != nil {
				select {
				case c.debugAddr <- "http://" + m[1]:
				default:
				}
			}
			if m := listeningRe.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
			fmt.Fprintln(logf, line)
		}
	}()
	go func() { c.waited <- cmd.Wait() }()
	select {
	case c.URL = <-found:
		select {
		case c.HealthURL = <-health: // printed before the listening line
		default:
		}
		select {
		case c.DebugURL = <-c.debugAddr: // also before
		default:
		}
		return c, nil
	case err := <-c.waited:
		return nil, fmt.Errorf("rollbox serve exited before listening (%v); see %s", err, logf.Name())
	case <-time.After(60 * time.Second):
		c.Stop()
		return nil, errors.New("rollbox serve did not start listening in 60s")
	case <-ctx.Done():
		c.Stop()
		return nil, ctx.Err()
	}
}

// PeakRSS is the service's VmHWM.
func (c *Service) PeakRSS() int64 { return proc.PeakRSS(strconv.Itoa(c.cmd.Process.Pid)) }

// RSS is the service's resident memory now.
func (c *Service) RSS() int64 { return proc.RSS(strconv.Itoa(c.cmd.Process.Pid)) }

// CPUSeconds is the service's user+system CPU time so far.
func (c *Service) CPUSeconds() float64 { return proc.CPUSeconds(strconv.Itoa(c.cmd.Process.Pid)) }

// Stop ends the service (SIGTERM, then SIGKILL after a minute) and waits for it.
func (c *Service) Stop() {
	if c == nil || c.cmd.Process == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.waited:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
		<-c.waited
	}
	c.logf.Close()
	c.cmd = &exec.Cmd{}
}

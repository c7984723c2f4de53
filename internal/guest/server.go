//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"runtime"
	"sync"
	"syscall"

	"github.com/rollbox/rollbox/internal/guestproto"
)

// AgentVersion names this guest build in HelloReply.
const AgentVersion = "rollbox-guest/1"

// Server serves one host over one stream.
type Server struct {
	ctx    context.Context // the session: ended by the end of the stream
	cancel context.CancelFunc
	w      *guestproto.Writer
	log    *log.Logger
	procs  *procs
	oom    oomCounter
	wg     sync.WaitGroup

	mu           sync.Mutex
	key          []byte // seals every reply once Hello gave one
	writeRoots   []string
	guardStarted bool
	running      map[uint32]context.CancelFunc // exec id -> cancel

	guardMu sync.Mutex
	guarded map[*command]bool
}

// Serve answers requests read from r on w until r ends, then kills every
// command still running and returns. Logs go to logw (the container's
// stderr), never to w.
func Serve(r io.Reader, w io.Writer, logw io.Writer) error {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		ctx: ctx, cancel: cancel,
		w:       guestproto.NewWriter(w),
		log:     log.New(logw, "guest: ", log.Lmicroseconds),
		procs:   processTable(),
		oom:     newOOMCounter(),
		running: map[uint32]context.CancelFunc{},
		guarded: map[*command]bool{},
	}
	rd := guestproto.NewReader(r)
	var err error
	for {
		var m guestproto.Message
		m, err = rd.ReadMessage()
		if err != nil {
			break
		}
		s.dispatch(m)
	}
	cancel() // kills running commands
	s.wg.Wait()
	if errors.Is(err, io.EOF) {
		return nil
	}
	s.log.Printf("stream: %v", err)
	return err
}

func (s *Server) roots() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeRoots
}

func (s *Server) dispatch(m guestproto.Message) {
	body, err := guestproto.DecodeMessage(m)
	if err != nil {
		s.reply(m.ID, guestproto.TypeError, invalid(fmt.Sprintf("%s: %v", m.Type, err)))
		return
	}
	switch req := body.(type) {
	case *guestproto.Hello:
		s.hello(m.ID, req)
		return
	case nil:
		switch m.Type {
		case guestproto.TypePing:
			s.reply(m.ID, guestproto.TypePong, nil)
		case guestproto.TypeCancel:
			s.mu.Lock()
			cancel := s.running[m.ID]
			s.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		default:
			s.reply(m.ID, guestproto.TypeError, invalid(fmt.Sprintf("%s is not a request", m.Type)))
		}
		return
	case *guestproto.Exec:
		ctx, cancel := context.WithCancel(s.ctx)
		s.mu.Lock()
		s.running[m.ID] = cancel
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.running, m.ID)
				s.mu.Unlock()
				cancel()
			}()
			res, err := s.run(ctx, req)
			if err != nil {
				s.replyErr(m.ID, err)
				return
			}
			s.reply(m.ID, guestproto.TypeExecResult, res)
		}()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		switch req := body.(type) {
		case *guestproto.ReadFile:
			if data, e := s.readFile(req); e != nil {
				s.reply(m.ID, guestproto.TypeError, e)
			} else {
				s.reply(m.ID, guestproto.TypeFileData, data)
			}
		case *guestproto.WriteFile:
			if e := s.writeFile(req); e != nil {
				s.reply(m.ID, guestproto.TypeError, e)
			} else {
				s.reply(m.ID, guestproto.TypeOK, nil)
			}
		case *guestproto.ListDir:
			if list, e := s.listDir(req); e != nil {
				s.reply(m.ID, guestproto.TypeError, e)
			} else {
				s.reply(m.ID, guestproto.TypeDirList, list)
			}
		default:
			s.reply(m.ID, guestproto.TypeError, invalid(fmt.Sprintf("%s is not a request", m.Type)))
		}
	}()
}

func (s *Server) hello(id uint32, h *guestproto.Hello) {
	if h.Version != int(guestproto.Version) {
		s.reply(id, guestproto.TypeError, invalid(fmt.Sprintf("hello: protocol version %d, this guest speaks %d", h.Version, guestproto.Version)))
		return
	}
	var roots []string
	for _, r := range h.WritableRoots {
		if e := checkPath(r); e != nil || r == "/" {
			s.reply(id, guestproto.TypeError, invalid(fmt.Sprintf("hello: writable root %q must be a clean absolute path other than /", r)))
			return
		}
		roots = append(roots, r)
	}
	if len(h.Key) != 0 && len(h.Key) != guestproto.KeySize {
		s.reply(id, guestproto.TypeError, invalid(fmt.Sprintf("hello: a key of %d bytes, want %d", len(h.Key), guestproto.KeySize)))
		return
	}
	if h.ProcessLimit > 0 {
		lim := &syscall.Rlimit{Cur: uint64(h.ProcessLimit), Max: uint64(h.ProcessLimit)}
		if err := syscall.Setrlimit(rlimitNproc, lim); err != nil {
			s.log.Printf("hello: process limit %d: %v", h.ProcessLimit, err)
		}
	}
	source := s.oom.source
	s.mu.Lock()
	s.writeRoots = roots
	if len(h.Key) > 0 {
		s.key = append([]byte(nil), h.Key...)
	}
	startGuard := h.MemoryGuardBytes > 0 && !s.guardStarted
	if startGuard {
		s.guardStarted = true
	}
	s.mu.Unlock()
	if h.MemoryGuardBytes > 0 {
		source = "guard"
	}
	if startGuard {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.guardLoop(h.MemoryGuardBytes) }()
	}
	s.reply(id, guestproto.TypeHelloReply, &guestproto.HelloReply{
		Version: int(guestproto.Version), Agent: AgentVersion, PID: os.Getpid(), OOMSource: source,
		Sealed: len(h.Key) > 0,
	})
}

func (s *Server) replyErr(id uint32, err error) {
	var e *guestproto.Error
	if !errors.As(err, &e) {
		e = &guestproto.Error{Code: guestproto.CodeInternal, Message: err.Error()}
	}
	s.reply(id, guestproto.TypeError, e)
}

func (s *Server) reply(id uint32, t guestproto.Type, body guestproto.Payload) {
	var p []byte
	if body != nil {
		p = body.Encode(nil)
	}
	s.mu.Lock()
	key := s.key
	s.mu.Unlock()
	if key != nil {
		p = guestproto.Seal(key, t, id, p)
	}
	if err := s.w.WriteMessage(t, id, p); err != nil {
		s.log.Printf("reply %s to %d: %v", t, id, err)
	}
}

const rlimitNproc = 6 // RLIMIT_NPROC

// PrepareInit readies the process to be a container's PID 1 before it
// serves: it makes sure the Go runtime holds a few OS threads already (a
// fork bomb that fills the pids limit must not leave the guest unable to
// start one), drops every signal a command could send to kill it, and
// makes itself non-dumpable so commands cannot reach it through /proc or
// ptrace.
//
// # Notes
//
// Commands run as the guest's own uid, so without this a command could
// `kill -TERM 1` (Go exits on SIGTERM, SIGINT, SIGQUIT and on a SIGSEGV,
// SIGABRT... sent by kill) or open /proc/1/fd/1, the protocol stream to the
// host, and write frames into it, or ptrace the guest: each turns the
// command's failure into a sandbox failure (an unscored episode, which a
// policy under optimisation pressure learns to prefer over a zero), and the
// last two let it forge results. A non-dumpable process's /proc entries
// belong to root and only CAP_SYS_PTRACE may trace it; commands get their
// dumpable flag back at execve, so they can still debug each other.
func PrepareInit(threads int) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-start
			runtime.UnlockOSThread()
		}()
	}
	close(start)
	wg.Wait()
	// SIGPIPE on stdout (the host went away) must not kill PID 1 silently;
	// writes then fail with EPIPE and Serve ends.
	signalIgnore(syscall.SIGPIPE, syscall.SIGHUP)
	// The rest are what a command could send to kill PID 1 through the Go
	// runtime's default actions. They are caught and dropped rather than
	// ignored: an ignored disposition would be inherited by every command
	// (a SIGTERM-proof `sleep`), a caught one is reset at exec. A
	// synchronous fault in the guest itself still crashes it.
	signalDiscard(syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
		syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGILL, syscall.SIGBUS, syscall.SIGFPE,
		syscall.SIGSEGV, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGVTALRM,
		syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGSTKFLT, syscall.SIGPWR, syscall.SIGTSTP,
		syscall.SIGTTIN, syscall.SIGTTOU)
	// The process table opens /proc/self/oom_score_adj for writing: that
	// must happen while the entry is still ours, before it turns root's.
	processTable()
	syscall.RawSyscall6(syscall.SYS_PRCTL, prSetDumpable, 0, 0, 0, 0, 0)
}

const prSetDumpable = 4 // PR_SET_DUMPABLE

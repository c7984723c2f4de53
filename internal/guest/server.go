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
	"slices"
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
	// devNull is /dev/null, read-only, kept open: the stdin of every
	// command given none (-1 when it could not be opened: each opens it).
	devNull int
	wg      sync.WaitGroup
	// slots bounds the requests that may be in system calls at once
	// (requestSlots): each holds the thread it blocks, see PrepareInit.
	slots chan struct{}

	mu           sync.Mutex
	helloDone    bool
	key          []byte // seals every reply once Hello gave one
	writeRoots   []string
	guardStarted bool
	running      map[uint32]context.CancelFunc // exec id -> cancel

	// usage is the memory guard's sample of the sandbox's memory use
	// (memUsed; tests on the host give their own).
	usage     func() int64
	guardWake chan struct{} // a guarded command started or ended
	// maxList bounds a directory listing's reply (maxListBytes; tests
	// give less).
	maxList int

	guardMu sync.Mutex
	guarded map[*command]bool
}

// Serve answers requests read from r on w until r ends, then kills every
// command still running and returns. Logs go to logw (the container's
// stderr), never to w.
func Serve(r io.Reader, w io.Writer, logw io.Writer) error {
	return newServer(w, logw).serve(r)
}

func newServer(w io.Writer, logw io.Writer) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		ctx: ctx, cancel: cancel,
		w:       guestproto.NewWriter(w),
		log:     log.New(logw, "guest: ", log.Lmicroseconds),
		procs:   processTable(),
		oom:     newOOMCounter(),
		devNull: openDevNull(),
		running: map[uint32]context.CancelFunc{},
		guarded: map[*command]bool{},
		slots:   make(chan struct{}, requestSlots),
		usage:   memUsed,
		maxList: maxListBytes,

		guardWake: make(chan struct{}, 1),
	}
}

func (s *Server) serve(r io.Reader) error {
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
	s.cancel() // kills running commands
	s.wg.Wait()
	if s.devNull >= 0 {
		syscall.Close(s.devNull)
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	s.log.Printf("stream: %v", err)
	return err
}

func openDevNull() int {
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// requestSlots is how many requests may be in system calls at once. A
// request holds a slot while it works (a file request throughout, a
// command while it starts, is killed and is swept) and not while it waits.
const requestSlots = 8

func (s *Server) enter() { s.slots <- struct{}{} }
func (s *Server) leave() { <-s.slots }

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
		s.enter()
		t, reply := s.fileRequest(m.Type, body)
		s.leave()
		s.reply(m.ID, t, reply)
	}()
}

// fileRequest serves a file request (or refuses what is not a request).
func (s *Server) fileRequest(t guestproto.Type, body guestproto.Payload) (guestproto.Type, guestproto.Payload) {
	switch req := body.(type) {
	case *guestproto.ReadFile:
		data, e := s.readFile(req)
		if e != nil {
			return guestproto.TypeError, e
		}
		return guestproto.TypeFileData, data
	case *guestproto.WriteFile:
		if e := s.writeFile(req); e != nil {
			return guestproto.TypeError, e
		}
		return guestproto.TypeOK, nil
	case *guestproto.ListDir:
		list, e := s.listDir(req)
		if e != nil {
			return guestproto.TypeError, e
		}
		return guestproto.TypeDirList, list
	}
	return guestproto.TypeError, invalid(fmt.Sprintf("%s is not a request", t))
}

func (s *Server) hello(id uint32, h *guestproto.Hello) {
	// Once: the host sends one Hello before any command exists. Another
	// came from a command writing into the guest's stdin (gVisor lets it
	// open /proc/1/fd/0), and must change nothing: not the key, not the
	// roots.
	s.mu.Lock()
	again := s.helloDone
	s.helloDone = true
	s.mu.Unlock()
	if again {
		s.reply(id, guestproto.TypeError, invalid("hello: this guest was already greeted"))
		return
	}
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
	for _, r := range h.SharedRoots {
		if !slices.Contains(roots, r) {
			s.reply(id, guestproto.TypeError, invalid(fmt.Sprintf("hello: shared root %q is not a writable root", r)))
			return
		}
	}
	for _, r := range roots {
		if err := fixRootMode(r, slices.Contains(h.SharedRoots, r)); err != nil {
			s.log.Printf("hello: %v", err)
		}
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
		go func() { defer s.wg.Done(); s.guardLoop(h.MemoryGuardBytes, s.usage) }()
	}
	s.reply(id, guestproto.TypeHelloReply, &guestproto.HelloReply{
		Version: int(guestproto.Version), Agent: AgentVersion, PID: os.Getpid(), OOMSource: source,
		Sealed: len(h.Key) > 0,
	})
}

// fixRootMode gives a writable root the mode it needs whatever the image
// made it: a container engine copies an image directory's mode onto the
// tmpfs mounted over it (Docker's tmpcopyup), so an image whose /tmp is
// 0755 or whose workdir is 0500 would leave commands unable to write
// there. The tmpfs is owned by the commands' user, the guest's own, so the
// guest may fix it: shared roots (/tmp) become 1777, the others gain rwx
// for their owner. A root owned by someone else is left alone.
func fixRootMode(root string, shared bool) error {
	var st syscall.Stat_t
	if err := syscall.Stat(root, &st); err != nil {
		return fmt.Errorf("writable root %s: %v", root, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return nil
	}
	mode := st.Mode & 0o7777
	want := mode | 0o700
	if shared {
		want = 0o1777
	}
	if want == mode {
		return nil
	}
	if err := syscall.Chmod(root, want); err != nil {
		return fmt.Errorf("writable root %s: chmod %o: %v", root, want, err)
	}
	return nil
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
// serves: it makes the Go runtime start every OS thread it will need now
// (see reserveThreads), drops every signal a command could send to kill
// it, makes itself non-dumpable so commands cannot reach it through
// /proc or ptrace, and installs a seccomp filter so they cannot change its
// resource limits (seccomp.go).
//
// # Notes
//
// The guest shares the container's pids limit with the commands. When the
// runtime wants a thread and the limit is full (a fork bomb, or a command
// that started as many processes as it may), clone fails and the runtime
// dies with "fatal error: newosproc": the sandbox fails. So the runtime
// must never need a thread it does not hold: GOMAXPROCS is capped at
// guestProcs, at most requestSlots requests are in system calls at once,
// and initThreads covers those plus the guest's own blocked goroutines
// (see reserveThreads).
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
func PrepareInit() {
	runtime.GOMAXPROCS(min(runtime.GOMAXPROCS(0), guestProcs))
	reserveThreads(initThreads)
	// SIGPIPE on stdout (the host went away) must not kill PID 1 silently;
	// writes then fail with EPIPE and Serve ends. Caught, not ignored: an
	// ignored SIGPIPE would be inherited by every command, and `yes | head`
	// would fail with EPIPE instead of ending the way it does elsewhere.
	signalDiscard(syscall.SIGPIPE, syscall.SIGHUP)
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
	// Nor may commands lower its resource limits (seccomp.go). Without a
	// filter the guest still serves; its log says why.
	if err := denyPrlimitOfOthers(); err != nil {
		fmt.Fprintf(os.Stderr, "guest: commands may change the guest's resource limits: %v\n", err)
	}
}

const prSetDumpable = 4 // PR_SET_DUMPABLE

// initThreads is how many OS threads PID 1 starts before it serves: one
// per P (guestProcs), one per request slot (requestSlots), one for each
// goroutine of the guest's own that blocks its thread (the reader of stdin,
// the writer of replies, the reaper, the memory guard, the logger, the
// runtime's signal loop and its network poller), and a margin. With the
// runtime's own (sysmon, the template thread) it stays within the 32 the
// docker backend allows the guest above the spec's pids limit
// (docker.guestThreads).
const initThreads = guestProcs + requestSlots + 7 + 4

// guestProcs caps GOMAXPROCS for PID 1: the guest moves bytes between
// pipes and the host, and every P is a thread it may need at once.
const guestProcs = 2

// reserveThreads makes the Go runtime hold at least n OS threads. The
// runtime keeps an idle thread for reuse and only creates one when none is
// idle, so once n exist, a process that never needs more than n at once
// never creates another.
//
// Each of n goroutines locks its thread and waits until all n are locked:
// only then are n threads known to exist at once. (Releasing them as soon
// as they were started let each finish before the next one ran, on the
// same thread or two: a guest that asked for 16 held 8 to 10, needed an
// eleventh under a fork bomb, and died.)
func reserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		locked.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			<-release // blocks this thread: the next goroutine needs another
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/rollbox/rollbox/internal/tinyelf"

	"golang.org/x/sys/unix"

	"github.com/rollbox/rollbox/internal/guestproto"
)

func probes() []probe {
	return []probe{
		{"ping", ping},
		{"identity", identity},
		{"net-egress", netEgress},
		{"net-gateway", netGateway},
		{"net-metadata", netMetadata},
		{"net-dns", netDNS},
		{"caps", caps},
		{"seccomp", seccomp},
		{"no-new-privs", noNewPrivs},
		{"mounts", mounts},
		{"proc-sys", procSys},
		{"syscalls", syscalls},
		{"guest", guestProbe},
		{"forkbomb", forkbomb},
		{"balloon", balloon},
		{"diskfill", diskfill},
		{"cpu", cpu},
		{"flood", flood},
		{"exe", exe},
		{"plant", plant},
		{"swap", swap},
		{"mem", mem},
		{"outlive", outlive},
		{"linger", linger},
		{"chain", chain},
		{"procs", procs},
		{"break-guest", breakGuest},
	}
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// refused reports whether err is the kernel (or the seccomp filter, or
// gVisor) saying no, rather than the call getting far enough to look at its
// arguments.
func refused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) ||
		errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EROFS)
}

func errno(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		if name := unix.ErrnoName(e); name != "" {
			return name
		}
	}
	if err == nil {
		return "allowed"
	}
	return err.Error()
}

// identity says which kernel answers: Linux (runc) or gVisor's sentry.
func identity(opts) finding {
	var n notes
	version, _ := os.ReadFile("/proc/version")
	v := strings.TrimSpace(string(version))
	n.add("/proc/version: %s", v)
	buf := make([]byte, 1<<14)
	k, err := unix.Klogctl(3 /* SYSLOG_ACTION_READ_ALL */, buf)
	dmesg := ""
	if err != nil {
		n.add("dmesg: %s", errno(err))
	} else {
		dmesg = string(buf[:k])
		first, _, _ := strings.Cut(strings.TrimSpace(dmesg), "\n")
		n.add("dmesg: %s", first)
	}
	gvisor := strings.Contains(dmesg, "gVisor")
	kernel := "linux"
	if gvisor {
		kernel = "gvisor"
	}
	return finding{Pass: true, Evidence: n.String(), Data: map[string]any{"kernel": kernel, "proc_version": v}}
}

// reach is what one attempt to reach an address found.
type reach struct {
	addr    string
	outcome string
	reached bool // the address answered (connected, or refused: something is there)
	routed  bool // the sandbox has a route to it
}

// try dials addr over TCP and checks for a route with a UDP connect (which
// sends nothing): a sandbox with no network has neither.
func try(addr string, timeout time.Duration) reach {
	r := reach{addr: addr}
	c, err := net.DialTimeout("tcp", addr, timeout)
	switch {
	case err == nil:
		c.Close()
		r.outcome, r.reached = "connected", true
	case errors.Is(err, syscall.ECONNREFUSED):
		r.outcome, r.reached = "refused by the address (it is reachable)", true
	case errors.Is(err, syscall.ENETUNREACH):
		r.outcome = "network unreachable"
	case errors.Is(err, syscall.EHOSTUNREACH):
		r.outcome = "host unreachable"
	case isTimeout(err):
		r.outcome = fmt.Sprintf("no answer in %v", timeout)
	default:
		r.outcome = err.Error()
	}
	if u, err := net.Dial("udp", addr); err == nil {
		r.routed = true
		r.outcome += fmt.Sprintf(", routed via %s", u.LocalAddr())
		u.Close()
	}
	return r
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tryAll tries every address at once.
func tryAll(addrs []string, timeout time.Duration) []reach {
	out := make([]reach, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = try(a, timeout) }()
	}
	wg.Wait()
	return out
}

func judgeReach(rs []reach, n *notes) bool {
	pass := true
	for _, r := range rs {
		n.add("%s: %s", r.addr, r.outcome)
		if r.reached || r.routed {
			pass = false
		}
	}
	return pass
}

func interfaces(n *notes) {
	ifs, err := net.Interfaces()
	if err != nil {
		n.add("interfaces: %v", err)
		return
	}
	var names []string
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		var as []string
		for _, a := range addrs {
			as = append(as, a.String())
		}
		names = append(names, fmt.Sprintf("%s[%s]", i.Name, strings.Join(as, " ")))
	}
	n.add("interfaces: %s", strings.Join(names, ", "))
}

const dialTimeout = 1500 * time.Millisecond

func netEgress(opts) finding {
	var n notes
	interfaces(&n)
	pass := judgeReach(tryAll([]string{"1.1.1.1:443", "8.8.8.8:53", "[2606:4700:4700::1111]:443"}, dialTimeout), &n)
	return finding{Pass: pass, Evidence: n.String()}
}

// defaultGateway reads the default route's gateway from /proc/net/route.
func defaultGateway() (string, bool) {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 3 || f[1] != "00000000" {
			continue
		}
		g, err := strconv.ParseUint(f[2], 16, 32)
		if err != nil || g == 0 {
			continue
		}
		return net.IPv4(byte(g), byte(g>>8), byte(g>>16), byte(g>>24)).String(), true
	}
	return "", false
}

func netGateway(o opts) finding {
	var n notes
	var addrs []string
	if gw, ok := defaultGateway(); ok {
		n.add("default route via %s", gw)
		addrs = append(addrs, net.JoinHostPort(gw, "22"), net.JoinHostPort(gw, "2375"))
	} else {
		n.add("no default route")
	}
	for _, a := range strings.Split(o.gateways, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return finding{Pass: true, Evidence: n.String()}
	}
	pass := judgeReach(tryAll(addrs, dialTimeout), &n)
	if !pass {
		n.add("the host (or its gateway) is reachable from the sandbox")
	}
	return finding{Pass: pass, Evidence: n.String()}
}

func netMetadata(opts) finding {
	var n notes
	pass := judgeReach(tryAll([]string{"169.254.169.254:80", "[fd00:ec2::254]:80"}, dialTimeout), &n)
	return finding{Pass: pass, Evidence: n.String()}
}

func netDNS(opts) finding {
	var n notes
	pass := true
	var servers []string
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
				servers = append(servers, f[1])
			}
		}
		n.add("resolv.conf nameservers: %v", servers)
	} else {
		n.add("no /etc/resolv.conf")
	}
	var addrs []string
	for _, s := range append(servers, "8.8.8.8", "1.1.1.1") {
		if ip := net.ParseIP(s); ip != nil && !ip.IsLoopback() {
			addrs = append(addrs, net.JoinHostPort(s, "53"))
		}
	}
	if !judgeReach(tryAll(addrs, dialTimeout), &n) {
		pass = false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	ips, err := r.LookupHost(ctx, "example.com")
	if err == nil {
		pass = false
		n.add("example.com resolved to %v", ips)
	} else {
		n.add("lookup example.com: %v", err)
	}
	return finding{Pass: pass, Evidence: n.String()}
}

// status reads /proc/self/status into a map.
func status() map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func caps(opts) finding {
	var n notes
	st := status()
	pass := true
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v, ok := st[k]
		if !ok {
			n.add("%s absent", k)
			if k == "CapEff" || k == "CapBnd" {
				pass = false
			}
			continue
		}
		n.add("%s %s", k, v)
		if x, err := strconv.ParseUint(v, 16, 64); err != nil || x != 0 {
			pass = false
		}
	}
	return finding{Pass: pass, Evidence: n.String(), Data: map[string]any{"CapEff": st["CapEff"], "CapBnd": st["CapBnd"]}}
}

// underGVisor reports whether the sentry answers (dmesg names it).
func underGVisor() bool {
	buf := make([]byte, 4096)
	k, err := unix.Klogctl(3, buf)
	return err == nil && bytes.Contains(buf[:k], []byte("gVisor"))
}

func seccomp(opts) finding {
	st := status()
	mode, ok := st["Seccomp"]
	if !ok {
		mode = "absent"
	}
	ev := fmt.Sprintf("Seccomp: %s", mode)
	if f, ok := st["Seccomp_filters"]; ok {
		ev += fmt.Sprintf(", Seccomp_filters: %s", f)
	}
	if mode == "2" {
		// The guest installs a filter of its own (prlimit of other
		// processes, inherited by every command), so filter mode alone no
		// longer shows the engine's profile. The runtimes' default
		// profiles (Docker's, containerd's) refuse keyctl, which nothing
		// else here does: refused, a profile is in force; answered, only
		// the guest's filter is.
		_, kerr := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
		ev += fmt.Sprintf("; keyctl(KEYCTL_GET_KEYRING_ID): %s", errno(kerr))
		if refused(kerr) {
			return finding{Pass: true, Evidence: ev + " (filter mode; the engine's profile refuses keyctl)", Data: map[string]any{"mode": mode}}
		}
		return finding{Evidence: ev + ": the only filter is the guest's own (keyctl answered): no seccomp profile from the engine", Data: map[string]any{"mode": mode}}
	}
	if underGVisor() {
		return finding{Pass: true, Evidence: ev + "; gVisor: every syscall is served by the sentry, which itself runs under runsc's seccomp filter on the host (not visible from inside)", Data: map[string]any{"mode": mode, "kernel": "gvisor"}}
	}
	return finding{Evidence: ev + ": no seccomp filter on a Linux kernel", Data: map[string]any{"mode": mode}}
}

func noNewPrivs(opts) finding {
	st := status()
	v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	ev := fmt.Sprintf("prctl(PR_GET_NO_NEW_PRIVS) = %d (%s)", v, errno(err))
	if s, ok := st["NoNewPrivs"]; ok {
		ev += ", NoNewPrivs: " + s
	}
	return finding{Pass: err == nil && v == 1, Evidence: ev}
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	root, point, opts, fstype, source string
}

func mountinfo() ([]mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(string(b)), nil
}

func parseMountinfo(s string) []mount {
	var out []mount
	for _, line := range strings.Split(s, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 6 || len(g) < 1 {
			continue
		}
		m := mount{root: unescape(f[3]), point: unescape(f[4]), opts: f[5], fstype: g[0]}
		if len(g) > 1 {
			m.source = g[1]
		}
		out = append(out, m)
	}
	return out
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// pseudoFS are filesystems that hold no host data.
var pseudoFS = map[string]bool{
	"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true, "cgroup": true,
	"cgroup2": true, "devtmpfs": true, "securityfs": true, "debugfs": false, "overlay": true,
}

// hostFiles are the files the engine itself binds in: allowed when read-only.
var hostFiles = map[string]bool{
	"/etc/hostname": true, "/etc/hosts": true, "/etc/resolv.conf": true, "/.rollbox/guest": true,
	channelPath: true, // the containerd backend's guest channel, a socket nobody listens on once the guest connected
}

// sockets are the engine sockets no sandbox may see.
var sockets = []string{
	"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
	"/var/run/containerd/containerd.sock", "/run/containerd/containerd.sock.ttrpc",
	"/run/crio/crio.sock", "/var/run/crio/crio.sock", "/run/podman/podman.sock",
	"/run/buildkit/buildkitd.sock", "/var/run/dockershim.sock",
}

func allowedPoint(p, workdir string) bool {
	switch {
	case p == "/", p == "/tmp", p == workdir, hostFiles[p]:
		return true
	}
	for _, prefix := range []string{"/proc", "/dev", "/sys"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// judgeMounts applies the mount rules to a mount table; it is separate from
// the probe so tests can feed it tables.
func judgeMounts(ms []mount, workdir string, n *notes) bool {
	pass := true
	var writable []string
	for _, m := range ms {
		ro := hasOpt(m.opts, "ro")
		if !ro {
			writable = append(writable, m.point)
		}
		switch {
		case strings.Contains(m.point, ".sock") || strings.Contains(m.root, ".sock"):
			n.add("engine socket mounted: %s (from %s)", m.point, m.root)
			pass = false
		case !allowedPoint(m.point, workdir):
			n.add("unexpected mount %s (%s from %s%s, %s)", m.point, m.fstype, m.source, m.root, m.opts)
			pass = false
		case hostFiles[m.point] && !ro:
			n.add("host file %s is mounted writable", m.point)
			pass = false
		case m.point == "/" && !ro:
			n.add("the root filesystem is mounted writable")
			pass = false
		case (m.point == "/tmp" || m.point == workdir) && m.fstype != "tmpfs":
			n.add("%s is %s, not a size-limited tmpfs (host storage?)", m.point, m.fstype)
			pass = false
		case strings.HasPrefix(m.point, "/proc") && m.point != "/proc" && !pseudoFS[m.fstype] && !ro:
			n.add("%s is a writable %s mount", m.point, m.fstype)
			pass = false
		}
	}
	n.add("%d mounts; writable: %s", len(ms), strings.Join(writable, " "))
	return pass
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

func mounts(o opts) finding {
	var n notes
	ms, err := mountinfo()
	if err != nil {
		return finding{Evidence: fmt.Sprintf("read mountinfo: %v", err)}
	}
	pass := judgeMounts(ms, o.dir, &n)
	for _, s := range sockets {
		if _, err := os.Lstat(s); err == nil {
			n.add("engine socket present: %s", s)
			pass = false
		}
	}
	if err := os.WriteFile("/.rollbox-probe-write", []byte("x"), 0o644); err == nil {
		os.Remove("/.rollbox-probe-write")
		n.add("wrote /.rollbox-probe-write: the root is writable")
		pass = false
	} else {
		n.add("write to /: %s", errno(err))
	}
	if err := os.WriteFile("/etc/.rollbox-probe-write", []byte("x"), 0o644); err == nil {
		os.Remove("/etc/.rollbox-probe-write")
		n.add("wrote /etc/.rollbox-probe-write")
		pass = false
	}
	return finding{Pass: pass, Evidence: n.String()}
}

// procSys tries to open kernel tunables and cgroup limits for writing. It
// never writes anything that would change the host: a tunable that opens is
// already a failure.
func procSys(opts) finding {
	var n notes
	pass := true
	paths := []string{
		"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
		"/proc/sys/net/ipv4/ip_forward", "/proc/sysrq-trigger", "/proc/sys/kernel/modprobe",
		"/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
		"/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
		"/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cgroup.procs",
		"/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/memory/release_agent",
	}
	var refusedN, missing int
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			unix.Close(fd)
			n.add("%s: opened for writing", p)
			pass = false
		case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR):
			missing++
		default:
			refusedN++
			n.add("%s: %s", p, errno(err))
		}
	}
	n.add("%d refused, %d absent", refusedN, missing)
	return finding{Pass: pass, Evidence: n.String()}
}

// syscalls tries the calls a container escape starts with.
func syscalls(opts) finding {
	var n notes
	pass := true
	gvisor := underGVisor()
	check := func(what string, err error) {
		if err == nil && gvisor && strings.Contains(what, "CLONE_NEW") {
			// gVisor implements namespaces in the sentry: the host kernel
			// never sees them, and they grant nothing over the sandbox's
			// other objects.
			n.add("%s: allowed by gVisor's sentry (its own namespaces, not the host kernel's)", what)
			return
		}
		if gvisor && (errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.ENODEV)) {
			n.add("%s: %s (not implemented by gVisor's sentry)", what, errno(err))
			return
		}
		n.add("%s: %s", what, errno(err))
		if !refused(err) {
			pass = false
		}
	}
	os.MkdirAll("/tmp/.rollbox-probe-mnt", 0o755)
	check("mount tmpfs", unix.Mount("none", "/tmp/.rollbox-probe-mnt", "tmpfs", 0, ""))
	check("mount --bind /", unix.Mount("/", "/tmp/.rollbox-probe-mnt", "", unix.MS_BIND, ""))
	check("umount /proc", unix.Unmount("/proc", unix.MNT_DETACH))
	func() {
		runtime.LockOSThread() // unshare changes this thread only; never unlocked: it dies with the goroutine
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			check("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS))
			check("unshare(CLONE_NEWNET)", unix.Unshare(unix.CLONE_NEWNET))
		}()
		<-done
		runtime.UnlockOSThread()
	}()
	self, _ := os.Executable()
	for _, c := range []struct {
		name  string
		flags uintptr
	}{{"clone(CLONE_NEWUSER)", unix.CLONE_NEWUSER}, {"clone(CLONE_NEWNS)", unix.CLONE_NEWNS}, {"clone(CLONE_NEWPID)", unix.CLONE_NEWPID}} {
		pid, err := syscall.ForkExec(self, []string{self, "ping"}, &syscall.ProcAttr{
			Sys: &syscall.SysProcAttr{Cloneflags: c.flags},
		})
		if err == nil {
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
		}
		check(c.name, err)
	}
	if fd, err := unix.Open("/proc/1/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		check("setns(/proc/1/ns/mnt)", unix.Setns(fd, unix.CLONE_NEWNS))
		unix.Close(fd)
	}
	check("ptrace(PTRACE_ATTACH, 1)", ptraceAttach(1))
	_, err := unix.AddKey("user", "rollbox-probe", []byte("x"), unix.KEY_SPEC_SESSION_KEYRING)
	check("add_key", err)
	_, err = unix.KeyctlJoinSessionKeyring("rollbox-probe")
	check("keyctl(JOIN_SESSION_KEYRING)", err)
	var h unix.FileHandle = unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
	fd, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY)
	if err == nil {
		unix.Close(fd)
	}
	check("open_by_handle_at (shocker)", err)
	_, _, e := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, 0, 0)
	check("bpf", errnoOrNil(e))
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
	pfd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
	if err == nil {
		unix.Close(pfd)
	}
	check("perf_event_open", err)
	check("finit_module", unix.FinitModule(-1, "", 0))
	_, _, e = unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	check("kexec_load", errnoOrNil(e))
	check("chroot", unix.Chroot("/tmp"))
	check("swapon", swapon("/tmp/.rollbox-probe-mnt"))
	return finding{Pass: pass, Evidence: n.String()}
}

func errnoOrNil(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func swapon(p string) error {
	b, _ := unix.BytePtrFromString(p)
	_, _, e := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(b)), 0, 0)
	return errnoOrNil(e)
}

// ptraceAttach attaches to pid and detaches at once if that worked.
func ptraceAttach(pid int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := unix.PtraceAttach(pid)
	if err == nil {
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WALL, nil)
		unix.PtraceDetach(pid)
	}
	return err
}

// forgedMarker is what forged replies print; the host looks for it.
const forgedMarker = "ROLLBOX-PROBE-FORGED-REPLY"

// guestProbe checks that a command cannot reach the guest agent (PID 1):
// not its protocol stream, memory or environment, not by ptrace, and that
// the signals it sends do not kill it (the host checks the guest still
// answers). With -forge, when the stream is reachable it writes forged exec
// results into it, and the host checks none was believed.
func guestProbe(o opts) finding {
	var n notes
	pass := true
	var streamW *os.File
	reachable := map[string]bool{}
	for _, p := range []struct {
		path string
		flag int
	}{{"/proc/1/fd/1", unix.O_WRONLY}, {"/proc/1/fd/0", unix.O_RDONLY | unix.O_NONBLOCK}, {"/proc/1/mem", unix.O_RDONLY}, {"/proc/1/environ", unix.O_RDONLY}, {"/proc/1/root/.", unix.O_RDONLY}} {
		fd, err := unix.Open(p.path, p.flag|unix.O_CLOEXEC, 0)
		if err != nil {
			n.add("open %s: %s", p.path, errno(err))
			continue
		}
		n.add("open %s: allowed", p.path)
		pass = false
		reachable[p.path] = true
		if p.path == "/proc/1/fd/1" {
			streamW = os.NewFile(uintptr(fd), p.path)
		} else {
			unix.Close(fd)
		}
	}
	if entries, err := os.ReadDir("/proc/1/fd"); err == nil {
		n.add("list /proc/1/fd: %d entries", len(entries))
	} else {
		n.add("list /proc/1/fd: %s", errno(err))
	}
	// The containerd backend's channel (a socket the host listened on only
	// until the guest connected): a connection must be refused now.
	if _, err := os.Lstat(channelPath); err == nil {
		if err := connectUnix(channelPath); err == nil {
			n.add("connect %s: allowed", channelPath)
			pass = false
			reachable["channel"] = true
		} else {
			n.add("connect %s: %s", channelPath, errno(err))
		}
	}
	// A socket among this command's own descriptors was inherited from
	// the guest (its channel).
	if socks := ownSockets(); len(socks) > 0 {
		n.add("sockets among this command's descriptors: %s", strings.Join(socks, " "))
		pass = false
		reachable["inherited-socket"] = true
	}
	if err := ptraceAttach(1); err == nil {
		n.add("ptrace(PTRACE_ATTACH, 1): allowed")
		pass = false
		reachable["ptrace"] = true
	} else {
		n.add("ptrace(PTRACE_ATTACH, 1): %s", errno(err))
	}
	var sent []string
	for _, s := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGABRT,
		syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGUSR1, syscall.SIGALRM, syscall.SIGPIPE} {
		if err := syscall.Kill(1, s); err == nil {
			sent = append(sent, unix.SignalName(s))
		}
	}
	n.add("signals delivered to PID 1: %s (the host checks it survived)", strings.Join(sent, " "))
	forged := 0
	if streamW != nil && o.forge {
		w := guestproto.NewWriter(streamW)
		body := (&guestproto.ExecResult{ExitCode: 0, Stdout: []byte(forgedMarker + "\n"), Duration: time.Millisecond}).Encode(nil)
		for id := uint32(1); id <= 4096; id++ {
			if err := w.WriteMessage(guestproto.TypeExecResult, id, body); err != nil {
				n.add("forging: %v", err)
				break
			}
			forged++
		}
		n.add("wrote %d forged exec results (ids 1..%d) into the guest's stream", forged, forged)
	}
	if streamW != nil {
		streamW.Close()
	}
	return finding{Pass: pass, Evidence: n.String(), Data: map[string]any{"forged": forged, "signals": sent, "reachable": reachable}}
}

// channelPath is where the containerd backend binds the guest's channel.
const channelPath = "/.rollbox/channel"

// connectUnix connects to the unix socket at path and closes the
// connection.
func connectUnix(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path})
}

// ownSockets lists the sockets among this process's descriptors.
func ownSockets() []string {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			out = append(out, e.Name()+"->"+l)
		}
	}
	return out
}

// forkbomb starts children that only pause, until the sandbox refuses,
// then kills them. It passes when a start was refused (EAGAIN) with the
// sandbox holding no more than o.pids tasks. The children are a 129-byte
// static program (pauseELF), so the bomb spends tasks, not memory.
func forkbomb(o opts) finding {
	if o.pids <= 0 {
		return finding{Evidence: "no -max-tasks given"}
	}
	prog := "/tmp/.rollbox-probe-pause"
	if err := os.WriteFile(prog, pauseELF(), 0o755); err != nil {
		return finding{Evidence: "writing the pause program: " + err.Error()}
	}
	defer os.Remove(prog)
	ceiling := max(4*o.pids, 1024)
	var pids []int
	var ferr error
	start := time.Now()
	for len(pids) < ceiling {
		pid, err := syscall.ForkExec(prog, []string{"pause"}, &syscall.ProcAttr{})
		if err != nil {
			ferr = err
			break
		}
		pids = append(pids, pid)
	}
	tasks := countTasks()
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	for _, p := range pids {
		var ws syscall.WaitStatus
		syscall.Wait4(p, &ws, 0, nil)
	}
	var n notes
	n.add("started %d children in %v, then: %v", len(pids), time.Since(start).Round(time.Millisecond), errOrNone(ferr))
	n.add("%d tasks in the sandbox at the refusal (allowed %d)", tasks, o.pids)
	contained := ferr != nil && (errors.Is(ferr, syscall.EAGAIN) || errors.Is(ferr, syscall.ENOMEM))
	pass := contained && tasks <= o.pids
	if ferr == nil {
		n.add("stopped by the probe's own ceiling of %d: not contained", ceiling)
	}
	return finding{Pass: pass, Evidence: n.String(), Data: map[string]any{"started": len(pids), "tasks": tasks, "max_tasks": o.pids}}
}

// pauseELF is a static x86-64 Linux program that calls pause(2) forever.
func pauseELF() []byte {
	return tinyelf.Exec([]byte{
		0xb8, 0x22, 0x00, 0x00, 0x00, // mov eax, 34 (pause)
		0x0f, 0x05, // syscall
		0xeb, 0xf7, // jmp back to mov
	})
}

// countTasks counts the threads of every process visible.
func countTasks() int {
	d, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	total := 0
	for _, e := range d {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		ts, err := os.ReadDir(filepath.Join("/proc", e.Name(), "task"))
		if err != nil {
			continue
		}
		total += len(ts)
	}
	return total
}

// balloon maps and touches memory in 16 MB steps up to o.mb; it should be
// killed first. It reports its progress on stderr, which the host keeps.
func balloon(o opts) finding {
	const step = 16 << 20
	var held [][]byte
	for mb := 0; mb < o.mb; mb += step >> 20 {
		b, err := unix.Mmap(-1, 0, step, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return finding{Evidence: fmt.Sprintf("mmap refused after %d MB: %s (not killed)", mb, errno(err)), Data: map[string]any{"mb": mb}}
		}
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		fmt.Fprintf(os.Stderr, "balloon %d MB\n", mb+step>>20)
	}
	return finding{Evidence: fmt.Sprintf("allocated and touched %d MB without being stopped", o.mb), Data: map[string]any{"mb": o.mb, "chunks": len(held)}}
}

// cpu spins more threads than the quota allows for o.spinFor and compares
// the CPU time used with the wall time.
func cpu(o opts) finding {
	threads := max(2, int(math.Ceil(o.cpus))+1)
	var before, after unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &before)
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			x := 0
			for {
				select {
				case <-stop:
					_ = x
					return
				default:
				}
				for i := 0; i < 100000; i++ {
					x += i
				}
			}
		}()
	}
	time.Sleep(o.spinFor)
	close(stop)
	wg.Wait()
	wall := time.Since(start)
	unix.Getrusage(unix.RUSAGE_SELF, &after)
	used := tv(after.Utime) - tv(before.Utime) + tv(after.Stime) - tv(before.Stime)
	ratio := used.Seconds() / wall.Seconds()
	allowed := o.cpus*1.1 + 0.1
	var n notes
	n.add("%d spinning threads for %v: %.2fs CPU over %.2fs wall = %.2f CPUs (quota %.2f, allowed up to %.2f)",
		threads, o.spinFor, used.Seconds(), wall.Seconds(), ratio, o.cpus, allowed)
	host := runtime.NumCPU()
	pass := ratio <= allowed
	if float64(host) <= o.cpus {
		n.add("only %d CPUs visible: the quota cannot be exceeded here, so this run proves nothing", host)
	}
	return finding{Pass: pass, Evidence: n.String(), Data: map[string]any{"ratio": ratio, "cpus": o.cpus, "threads": threads, "host_cpus": host}}
}

func tv(t unix.Timeval) time.Duration {
	return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
}

// exe tries to open the running runtime binaries for writing through /proc:
// CVE-2019-5736 overwrote the host's runc through /proc/self/exe of a
// process runc had just exec'd into the container. A process whose exe is
// a file in the sandbox's own writable directories (this probe, in /tmp) is
// skipped: writing it changes nothing outside. Every other exe (the guest,
// a host binary bound in, a runtime exec'd in) must refuse.
func exe(o opts) finding {
	var n notes
	pass := true
	own := func(target string) bool {
		for _, d := range []string{"/tmp", o.dir} {
			if d != "" && strings.HasPrefix(target, d+"/") {
				return true
			}
		}
		return false
	}
	try := func(p string) {
		if target, err := os.Readlink(p); err == nil && own(target) {
			n.add("%s -> %s: the sandbox's own file, skipped", p, target)
			return
		}
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			n.add("%s: opened for writing", p)
			pass = false
			return
		}
		n.add("%s: %s", p, errno(err))
	}
	try("/proc/self/exe")
	try("/proc/1/exe")
	if fd, err := unix.Open("/.rollbox/guest", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(fd)
		n.add("/.rollbox/guest: opened for writing")
		pass = false
	} else {
		n.add("/.rollbox/guest: %s", errno(err))
	}
	// The exploit's way: an O_PATH descriptor reopened for writing.
	if fd, err := unix.Open("/proc/1/exe", unix.O_PATH|unix.O_CLOEXEC, 0); err == nil {
		p := fmt.Sprintf("/proc/self/fd/%d", fd)
		wfd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(wfd)
			n.add("O_PATH of /proc/1/exe reopened for writing")
			pass = false
		} else {
			n.add("O_PATH of /proc/1/exe reopened for writing: %s", errno(err))
		}
		unix.Close(fd)
	} else {
		n.add("O_PATH /proc/1/exe: %s", errno(err))
	}
	others := 0
	if d, err := os.ReadDir("/proc"); err == nil {
		for _, e := range d {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 || pid == os.Getpid() {
				continue
			}
			p := "/proc/" + e.Name() + "/exe"
			if target, err := os.Readlink(p); err == nil && own(target) {
				continue
			}
			if fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
				unix.Close(fd)
				n.add("%s: opened for writing", p)
				pass = false
			}
			others++
		}
	}
	n.add("%d other processes' exe tried", others)
	return finding{Pass: pass, Evidence: n.String()}
}

// plant makes the symlinks a copy-out must not follow.
func plant(o opts) finding {
	links := map[string]string{
		"leak-shadow":   "/etc/shadow",
		"leak-root":     "/",
		"leak-relative": "../../../../../../../../etc/hostname",
		"leak-proc":     "/proc/1/root/etc/shadow",
		"leak-self":     "/proc/self/root/etc/passwd",
	}
	var n notes
	pass := true
	names := make([]string, 0, len(links))
	for name := range links {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		target := links[name]
		p := filepath.Join(o.dir, name)
		os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			n.add("%s: %v", p, err)
			pass = false
			continue
		}
		n.add("%s -> %s", p, target)
	}
	return finding{Pass: pass, Evidence: n.String()}
}

// swap keeps exchanging o.dir/race (a directory holding etc/hostname) with
// a symlink to / for o.spinFor, racing the host's reads through race
// (CVE-2018-15664 swapped a path for a symlink during docker cp).
func swap(o opts) finding {
	race, alt := o.dir+"/race", o.dir+"/race-alt"
	os.RemoveAll(race)
	os.Remove(alt)
	if err := os.MkdirAll(race+"/etc", 0o755); err != nil {
		return finding{Evidence: err.Error()}
	}
	os.WriteFile(race+"/etc/hostname", []byte("sandbox-file\n"), 0o644)
	if err := os.Symlink("/", alt); err != nil {
		return finding{Evidence: err.Error()}
	}
	exchange := true
	deadline := time.Now().Add(o.spinFor)
	n := 0
	for time.Now().Before(deadline) {
		if exchange {
			if err := unix.Renameat2(unix.AT_FDCWD, race, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE); err != nil {
				exchange = false // gVisor may lack it: swap in three renames
				continue
			}
		} else {
			tmp := o.dir + "/race-tmp"
			os.Rename(race, tmp)
			os.Rename(alt, race)
			os.Rename(tmp, alt)
		}
		n++
	}
	return finding{Pass: true, Evidence: fmt.Sprintf("%d swaps of %s and a symlink to / (atomic exchange: %v)", n, race, exchange)}
}

// mem reports the sandbox's memory use as its kernel sees it (MemTotal -
// MemAvailable): under gVisor, the sandbox's own.
func mem(opts) finding {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return finding{Evidence: err.Error()}
	}
	var total, avail int64 = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n
		case "MemAvailable":
			avail = n
		}
	}
	used := float64(total-avail) / 1024
	return finding{Pass: total >= 0 && avail >= 0, Evidence: fmt.Sprintf("%.0f MB used", used), Data: map[string]any{"used_mb": used}}
}

// outlive leaves processes behind the way a command that wants to outlive
// itself would, and exits at once: a daemon (a double fork into a session
// of its own, parent 1), fork chains that change session at every link
// (each link forks the next and exits), and pausing children in its own
// group. The host then runs procs: nothing may be left.
func outlive(opts) finding {
	var n notes
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	start := func(args ...string) error {
		_, err := syscall.ForkExec(self, append([]string{self}, args...), &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setsid: true}})
		return err
	}
	if err := start("linger"); err != nil {
		n.add("daemon: %v", err)
	} else {
		n.add("started a double-forked daemon in a new session")
	}
	chains := 0
	for range 4 {
		if start("chain") == nil {
			chains++
		}
	}
	n.add("started %d fork chains that fork a new session at every link", chains)
	prog := "/tmp/.rollbox-probe-outlive-pause"
	paused := 0
	if err := os.WriteFile(prog, pauseELF(), 0o755); err == nil {
		for range 8 {
			if _, err := syscall.ForkExec(prog, []string{"pause"}, &syscall.ProcAttr{}); err == nil {
				paused++
			}
		}
	}
	n.add("started %d pausing children", paused)
	return finding{Pass: true, Evidence: n.String(), Data: map[string]any{"chains": chains, "paused": paused}}
}

// linger is outlive's daemon: it forks a sleeper (which it does not wait
// for) and exits, so the sleeper's parent becomes PID 1.
func linger(opts) finding {
	self, _ := os.Executable()
	syscall.ForkExec(self, []string{self, "chain", "-for", "0s"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setsid: true}})
	return finding{Pass: true, Evidence: "forked a sleeper and exited"}
}

// chain forks the next link in a new session and exits; with -for 0s it
// sleeps instead (linger's sleeper).
func chain(o opts) finding {
	self, _ := os.Executable()
	if o.spinFor == 0 {
		time.Sleep(time.Hour)
		return finding{}
	}
	syscall.ForkExec(self, []string{self, "chain"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setsid: true}})
	os.Exit(0)
	return finding{}
}

// procs lists every process but PID 1 and itself: after outlive's command
// ended, there must be none.
func procs(opts) finding {
	d, err := os.ReadDir("/proc")
	if err != nil {
		return finding{Evidence: "reading /proc: " + err.Error()}
	}
	self := os.Getpid()
	var left []string
	for _, e := range d {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		st, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		left = append(left, strings.TrimSpace(string(st)))
	}
	if len(left) == 0 {
		return finding{Pass: true, Evidence: "no process but PID 1 and this one", Data: map[string]any{"left": 0}}
	}
	return finding{Evidence: fmt.Sprintf("%d processes outlived their command: %s", len(left), strings.Join(left, " | ")), Data: map[string]any{"left": len(left)}}
}

// breakGuest tries to break the sandbox's guest agent the way a command
// can under some runtimes (gVisor lets a command signal PID 1 and write to
// its stream and its log) or any (a command runs as the guest's user, who
// may change the guest's resource limits), then waits a second for the
// guest's fate to show. The host
// judges: the sandbox must go on answering, or fail as the agent's doing.
func breakGuest(o opts) finding {
	var err error
	switch o.how {
	case "kill":
		err = syscall.Kill(1, syscall.SIGKILL)
	case "stop":
		err = syscall.Kill(1, syscall.SIGSTOP)
	case "garble":
		var f *os.File
		if f, err = os.OpenFile("/proc/1/fd/1", os.O_WRONLY, 0); err == nil {
			junk := make([]byte, 64<<10)
			for i := range junk {
				junk[i] = byte(i*7 + 3)
			}
			_, err = f.Write(junk)
			f.Close()
		}
	case "limits":
		// PID 1's limits lowered by a process of the same user (prlimit
		// asks for no more): with 3 descriptors the guest cannot make the
		// next command's pipes.
		err = unix.Prlimit(1, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 3, Max: 3}, nil)
	case "cpu":
		// A CPU time limit PID 1 has already spent: the kernel sends it
		// SIGKILL at its next tick, the exit an outside kill leaves.
		err = unix.Prlimit(1, unix.RLIMIT_CPU, &unix.Rlimit{Cur: 0, Max: 0}, nil)
	case "panic":
		// A Go panic's first line written into PID 1's stderr (the guest
		// log the host reads) where it is reachable, then PID 1 killed:
		// a broken guest that says it panicked.
		var f *os.File
		if f, err = os.OpenFile("/proc/1/fd/2", os.O_WRONLY, 0); err == nil {
			_, err = f.WriteString("panic: runtime error: invalid memory address or nil pointer dereference\n")
			f.Close()
		}
		if kerr := syscall.Kill(1, syscall.SIGKILL); err == nil {
			err = kerr
		}
	default:
		return finding{Evidence: fmt.Sprintf("-how %q is not kill, stop, garble, limits, cpu or panic", o.how)}
	}
	time.Sleep(time.Second)
	return finding{Pass: true, Evidence: fmt.Sprintf("%s: %s (the guest was not affected: this line reached the host)", o.how, errOrNone(err))}
}

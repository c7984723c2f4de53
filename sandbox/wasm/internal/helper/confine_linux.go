//go:build linux && amd64

package helper

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// confine applies to this process, in order: resource limits, dropping
// every capability, no_new_privs, a Landlock domain that can read only
// init.ReadOnly (and write nothing, connect nowhere, signal no process
// outside it), and a seccomp filter refusing process creation, exec,
// sockets, ptrace, mounts and the other calls a helper never makes. A Go
// program has many threads: the per-thread settings go through
// syscall.AllThreadsSyscall (the helper is built without cgo), seccomp
// through its TSYNC flag. What cannot be applied is reported in Notes and
// the host decides (the audit shows it).
func confine(init Init) Confinement {
	var c Confinement
	note := func(format string, args ...any) { c.Notes = append(c.Notes, fmt.Sprintf(format, args...)) }

	lim := func(res int, v uint64) error { return unix.Setrlimit(res, &unix.Rlimit{Cur: v, Max: v}) }
	if err := firstErr(
		lim(unix.RLIMIT_FSIZE, 0), // no file of the host is written
		lim(unix.RLIMIT_CORE, 0),
		lim(unix.RLIMIT_NOFILE, 256),
		lim(unix.RLIMIT_MEMLOCK, 0),
	); err != nil {
		note("rlimits: %v", err)
	} else {
		c.Rlimits = true
	}

	if os.Geteuid() == 0 || hasCaps() {
		err := dropCaps()
		if err != nil {
			note("capabilities: %v", err)
		}
		c.CapsDropped = err == nil
	} else {
		c.CapsDropped = true
	}

	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		note("no_new_privs: %v", e)
	} else {
		c.NoNewPrivs = true
	}

	abi, err := landlock(init.ReadOnly)
	if err != nil {
		note("landlock: %v", err)
	}
	c.Landlock = abi

	if c.NoNewPrivs {
		if err := installSeccomp(); err != nil {
			note("seccomp: %v", err)
		} else {
			c.Seccomp = true
		}
	} else {
		note("seccomp: needs no_new_privs")
	}
	return c
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// hasCaps reports a non-empty effective or permitted capability set.
func hasCaps() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true
	}
	return data[0].Effective|data[0].Permitted|data[1].Effective|data[1].Permitted != 0
}

// dropCaps empties the bounding, ambient, effective, permitted and
// inheritable sets of every thread.
func dropCaps() error {
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 && e != syscall.EINVAL {
		return fmt.Errorf("clear ambient: %v", e)
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 && e != syscall.EINVAL {
			return fmt.Errorf("drop %d from the bounding set: %v", c, e)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %v", e)
	}
	runtime.KeepAlive(&data)
	return nil
}

// rulesetAttr is struct landlock_ruleset_attr up to ABI 6.
type rulesetAttr struct {
	fs, net, scoped uint64
}

// landlock restricts every thread to reading the paths in ro; it returns
// the ABI version applied.
func landlock(ro []string) (int, error) {
	v, _, e := syscall.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0, fmt.Errorf("unavailable: %v", e)
	}
	abi := int(v)
	attr := rulesetAttr{fs: 0x1fff} // ABI 1: execute .. make_sym
	if abi >= 2 {
		attr.fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		attr.fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 4 {
		attr.net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
	}
	if abi >= 5 {
		attr.fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	size := unsafe.Sizeof(attr)
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
	} else {
		size = 16
	}
	fd, _, e := syscall.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if e != 0 {
		return 0, fmt.Errorf("create ruleset (ABI %d): %v", abi, e)
	}
	defer syscall.Close(int(fd))
	for _, p := range ro {
		pfd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // a path that does not exist grants nothing
		}
		var st unix.Stat_t
		access := uint64(unix.LANDLOCK_ACCESS_FS_READ_FILE)
		if unix.Fstat(pfd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			access |= unix.LANDLOCK_ACCESS_FS_READ_DIR
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(pfd)}
		_, _, e := syscall.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		unix.Close(pfd)
		if e != 0 {
			return 0, fmt.Errorf("add rule for %s: %v", p, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); e != 0 {
		return 0, fmt.Errorf("restrict self: %v", e)
	}
	return abi, nil
}

// BPF instruction helpers (classic BPF, as seccomp takes it).
func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	bpfLdW  = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeq  = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJge  = 0x35 // BPF_JMP | BPF_JGE | BPF_K
	bpfJset = 0x45 // BPF_JMP | BPF_JSET | BPF_K
	bpfRet  = 0x06 // BPF_RET | BPF_K

	offNr   = 0
	offArch = 4
	offArg0 = 16 // low 32 bits of args[0] (little endian)

	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
)

// seccompFilter builds the helper's filter: denied system calls fail with
// EPERM; clone only makes threads; kill and tgkill reach only this process.
func seccompFilter(pid uint32) []unix.SockFilter {
	prog := []unix.SockFilter{
		stmt(bpfLdW, offArch),
		jump(bpfJeq, auditArch, 1, 0),
		stmt(bpfRet, retKill),
		stmt(bpfLdW, offNr),
		// x32 system calls on amd64 (nr | 0x40000000): none is ours.
		jump(bpfJge, 0x40000000, 0, 1),
		stmt(bpfRet, retEPERM),
	}
	for _, nr := range deniedSyscalls {
		prog = append(prog, jump(bpfJeq, uint32(nr), 0, 1), stmt(bpfRet, retEPERM))
	}
	prog = append(prog,
		jump(bpfJeq, uint32(unix.SYS_CLONE3), 0, 1), stmt(bpfRet, retENOSYS),
		// clone: threads only (CLONE_THREAD set in the flags).
		jump(bpfJeq, uint32(unix.SYS_CLONE), 0, 4),
		stmt(bpfLdW, offArg0),
		jump(bpfJset, unix.CLONE_THREAD, 0, 1),
		stmt(bpfRet, retAllow),
		stmt(bpfRet, retEPERM),
		// kill and tgkill: this process only.
		jump(bpfJeq, uint32(unix.SYS_KILL), 1, 0),
		jump(bpfJeq, uint32(unix.SYS_TGKILL), 0, 4),
		stmt(bpfLdW, offArg0),
		jump(bpfJeq, pid, 0, 1),
		stmt(bpfRet, retAllow),
		stmt(bpfRet, retEPERM),
		stmt(bpfRet, retAllow),
	)
	return prog
}

func installSeccomp() error {
	prog := seccompFilter(uint32(os.Getpid()))
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := syscall.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return e
	}
	runtime.KeepAlive(prog)
	return nil
}

// LandlockAvailable reports whether this kernel has Landlock.
func LandlockAvailable() bool {
	v, _, e := syscall.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	return e == 0 && v > 0
}

//go:build linux

package guest

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The guest's seccomp filter keeps commands from changing its resource
// limits. Commands run as the guest's own uid, and prlimit(2) lets a
// process change the limits of any process of its real uid, whatever its
// dumpable flag: `prlimit --pid 1 --nofile=3` left the guest no descriptor
// for the next command's pipes (the sandbox failed as the guest's own
// failure: an unscored episode), and a CPU time limit below what the guest
// had spent made the kernel SIGKILL it, which on containerd under runc reads
// as a kill from outside (infrastructure). The guest's threads are
// processes' pids too, and a limit set through one is the guest's.
//
// So prlimit64 with a pid other than 0 (the caller) and a new limit is
// refused with EPERM, as the kernel refuses it without permission. Asking
// for another process's limits stays allowed, and so does setting one's
// own (ulimit, setrlimit, prlimit with pid 0, what runtimes and shells
// use). The filter is installed on every thread of the guest (TSYNC)
// before it serves, and every command inherits it across fork and exec.
//
// Each architecture the guest is built for lists its native prlimit64 and
// those of the compatibility ABIs its kernel may run (i386 and x32 on
// amd64, arm on arm64): a filter that checked the native number alone
// would let a command make the same call through another ABI.
var prlimitCalls = map[string][]struct {
	arch uint32
	nrs  []uint32
}{
	"amd64": {
		{unix.AUDIT_ARCH_X86_64, []uint32{302, 0x40000000 | 302}}, // native, x32
		{unix.AUDIT_ARCH_I386, []uint32{340}},
	},
	"arm64": {
		{unix.AUDIT_ARCH_AARCH64, []uint32{261}},
		{unix.AUDIT_ARCH_ARM, []uint32{369}},
	},
}

// Offsets in struct seccomp_data (little-endian: an argument's low word
// comes first).
const (
	seccompNr       = 0
	seccompArch     = 4
	seccompArg0Low  = 16 // pid: an int, of which the kernel takes the low 32 bits
	seccompArg2Low  = 32 // new_limit, a pointer: both words
	seccompArg2High = 36
)

// prlimitFilter is the BPF program of the filter for goarch, or nil when
// the guest knows no system call numbers for it.
func prlimitFilter(goarch string) []unix.SockFilter {
	arches := prlimitCalls[goarch]
	if len(arches) == 0 {
		return nil
	}
	ld := func(off uint32) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off}
	}
	ret := func(v uint32) unix.SockFilter { return unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: v} }
	// jeq's targets are labels resolved below: "" is the next instruction.
	type jump struct {
		at     int
		jt, jf string
	}
	var prog []unix.SockFilter
	var jumps []jump
	labels := map[string]int{}
	jeq := func(k uint32, jt, jf string) {
		jumps = append(jumps, jump{len(prog), jt, jf})
		prog = append(prog, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k})
	}
	for i, a := range arches {
		labels[fmt.Sprint("arch", i)] = len(prog)
		prog = append(prog, ld(seccompArch))
		next := "allow"
		if i+1 < len(arches) {
			next = fmt.Sprint("arch", i+1)
		}
		jeq(a.arch, "", next)
		prog = append(prog, ld(seccompNr))
		for _, nr := range a.nrs {
			jeq(nr, "check", "")
		}
		prog = append(prog, ret(unix.SECCOMP_RET_ALLOW))
	}
	labels["check"] = len(prog)
	prog = append(prog, ld(seccompArg0Low))
	jeq(0, "allow", "")
	prog = append(prog, ld(seccompArg2Low))
	jeq(0, "", "deny")
	prog = append(prog, ld(seccompArg2High))
	jeq(0, "allow", "deny")
	labels["deny"] = len(prog)
	prog = append(prog, ret(unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM)))
	labels["allow"] = len(prog)
	prog = append(prog, ret(unix.SECCOMP_RET_ALLOW))
	for _, j := range jumps {
		off := func(label string) uint8 {
			if label == "" {
				return 0
			}
			return uint8(labels[label] - j.at - 1)
		}
		prog[j.at].Jt, prog[j.at].Jf = off(j.jt), off(j.jf)
	}
	return prog
}

// denyPrlimitOfOthers installs the filter on every thread of the process.
func denyPrlimitOfOthers() error {
	prog := prlimitFilter(runtime.GOARCH)
	if prog == nil {
		return fmt.Errorf("no prlimit64 numbers known for %s", runtime.GOARCH)
	}
	// Required to install a filter without CAP_SYS_ADMIN; the runtimes set
	// it already (no-new-privileges).
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): thread %d could not take the filter", r)
	}
	return nil
}

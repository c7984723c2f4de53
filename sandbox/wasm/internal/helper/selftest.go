package helper

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Check is one attempt a confined helper makes on the host, and whether
// it was refused as it must be.
type Check struct {
	Name string `json:"name"`
	// Refused: the attempt failed (what confinement must ensure), or, for
	// an allowed read, succeeded.
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// SelfTestReport is what "selftest" prints: the confinement applied and
// the checks.
type SelfTestReport struct {
	Confinement Confinement `json:"confinement"`
	Checks      []Check     `json:"checks"`
}

// selfTestMain is "selftest READABLE_DIR": it confines itself as a helper
// does (READABLE_DIR readable, nothing else), then tries what a bug in the
// helper could make it do on the host, and prints the report as JSON. The
// audit and the tests run it: it proves the confinement by using it.
func selfTestMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: wasm-helper selftest READABLE_DIR")
		return 2
	}
	ro := args[0]
	rep := SelfTestReport{Confinement: confine(Init{ReadOnly: []string{ro}, Confine: true})}
	check := func(name string, mustFail bool, err error) {
		c := Check{Name: name, OK: (err != nil) == mustFail}
		if err != nil {
			c.Detail = err.Error()
		}
		rep.Checks = append(rep.Checks, c)
	}
	tmp := filepath.Join(os.TempDir(), "rollbox-helper-selftest-"+strconv.Itoa(os.Getpid()))
	check("write a host file", true, os.WriteFile(tmp, []byte("x"), 0o644))
	os.Remove(tmp)
	check("create a host directory", true, os.Mkdir(tmp+".d", 0o755))
	check("make a host FIFO", true, syscall.Mkfifo(tmp+".fifo", 0o600))
	_, err := os.ReadFile("/etc/passwd")
	check("read a host file (/etc/passwd)", true, err)
	_, err = os.ReadDir("/")
	check("list the host's root", true, err)
	_, err = os.Readlink("/proc/self/exe")
	check("resolve a host path (/proc/self/exe)", true, err)
	_, err = os.Stat("/etc/passwd")
	check("look up a host path (stat /etc/passwd)", true, err)
	_, err = os.ReadDir(ro)
	check("read the allowed directory", false, err)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.Close(fd)
	}
	check("open a network socket", true, err)
	fd, err = syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.Close(fd)
	}
	check("open a unix socket", true, err)
	_, err = syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	check("start a host program", true, err)
	check("signal the parent process", true, syscall.Kill(os.Getppid(), 0))
	check("signal init", true, syscall.Kill(1, 0))
	check("trace the parent process", true, syscall.PtraceAttach(os.Getppid()))
	check("become root (setuid 0)", true, syscall.Setuid(0))
	check("change root", true, syscall.Chroot("/"))
	check("mount", true, syscall.Mount("none", "/mnt", "tmpfs", 0, ""))
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim)
	rep.Checks = append(rep.Checks, Check{Name: "no file may grow (RLIMIT_FSIZE 0)", OK: lim.Cur == 0, Detail: fmt.Sprint(lim.Cur)})
	json.NewEncoder(os.Stdout).Encode(rep)
	for _, c := range rep.Checks {
		if !c.OK {
			return 1
		}
	}
	return 0
}

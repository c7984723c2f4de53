package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/rollbox/rollbox/runtime"
)

// A service that recycles itself (rollbox serve --recycle-above) executes
// its own image again in place, handing the new image its listening socket
// through these variables of the environment: the descriptor's number, and
// how many times the service has done so since it was started.
const (
	listenFDEnv = "ROLLBOX_LISTEN_FD"
	recyclesEnv = "ROLLBOX_RECYCLES"
)

// recycleCount is how many times this service re-executed itself before
// this image (from recyclesEnv).
var recycleCount int

// parseRecycle reads --recycle-above: "off", a percentage ("20%") or a size
// ("64MiB").
func parseRecycle(v string) (*runtime.RecyclePolicy, error) {
	v = strings.TrimSpace(v)
	if v == "off" {
		return nil, nil
	}
	if num, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || !(f > 0 && f <= 10000) {
			return nil, fmt.Errorf("%q: a percentage above 0 (20%%), a size (64MiB) or off", v)
		}
		return &runtime.RecyclePolicy{Fraction: f / 100}, nil
	}
	if _, err := strconv.ParseFloat(v, 64); err == nil {
		return nil, fmt.Errorf("%q: a percentage (20%%) or a size with its unit (64MiB), not a bare number", v)
	}
	n, err := parseSize(v)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("%q: a percentage above 0 (20%%), a size (64MiB) or off", v)
	}
	return &runtime.RecyclePolicy{Bytes: n}, nil
}

// inheritedListener is the listening socket a previous image of this
// process handed over (nil when none). The variables are removed from the
// environment: nothing this process starts inherits them.
func inheritedListener() (*os.File, error) {
	if fd, err := strconv.Atoi(os.Getenv(healthFDEnv)); err == nil && fd >= 3 {
		syscall.CloseOnExec(fd) // at once: a child started before its adoption must not hold it
	}
	v, ok := os.LookupEnv(listenFDEnv)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(listenFDEnv)
	recycleCount, _ = strconv.Atoi(os.Getenv(recyclesEnv))
	os.Unsetenv(recyclesEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not the descriptor of a listening socket (it is set by rollbox serve when it executes itself again)", listenFDEnv, v)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "inherited listener"), nil
}

// listen listens on addr, or takes over inherited (nil: none), which must
// be a TCP socket on addr's port (any port when addr's is 0).
func listen(addr string, inherited *os.File) (*net.TCPListener, error) {
	if inherited == nil {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return l.(*net.TCPListener), nil
	}
	defer inherited.Close()
	l, err := net.FileListener(inherited)
	if err != nil {
		return nil, fmt.Errorf("the listening socket handed over by the previous image (%s): %w", listenFDEnv, err)
	}
	tcp, ok := l.(*net.TCPListener)
	_, port, _ := net.SplitHostPort(addr)
	if !ok || (port != "0" && strconv.Itoa(tcp.Addr().(*net.TCPAddr).Port) != port) {
		l.Close()
		return nil, fmt.Errorf("the listening socket handed over by the previous image (%s) is on %s, not --addr %s", listenFDEnv, l.Addr(), addr)
	}
	return tcp, nil
}

// keepAcrossExec clears f's close-on-exec flag: the next image of this
// process inherits its descriptor.
func keepAcrossExec(f *os.File) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_SETFD, 0); errno != 0 {
		return errno
	}
	return nil
}

// execSelf executes this process's own image again (/proc/self/exe: the
// same file even if it was replaced or removed since; a test's child process
// through env.self), with the same arguments, handing it ln. It returns only
// when it could not.
func execSelf(env *cliEnv, ln *os.File) error {
	if !env.ownProcess {
		return errors.New("this process is not rollbox's own (a test runs the command inside itself)")
	}
	path, argv, environ := "/proc/self/exe", append([]string{os.Args[0]}, env.args...), os.Environ()
	if env.self != nil {
		c, err := env.self(env.args...)
		if err != nil {
			return err
		}
		path, argv = c.Path, c.Args
		if c.Env != nil {
			environ = c.Env
		}
	}
	fd := int(ln.Fd())
	if err := keepAcrossExec(ln); err != nil {
		return fmt.Errorf("keeping the listening socket open across exec: %w", err)
	}
	var vars []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, listenFDEnv+"=") && !strings.HasPrefix(kv, recyclesEnv+"=") {
			vars = append(vars, kv)
		}
	}
	vars = append(vars, listenFDEnv+"="+strconv.Itoa(fd), recyclesEnv+"="+strconv.Itoa(recycleCount+1))
	err := syscall.Exec(path, argv, vars)
	syscall.CloseOnExec(fd)
	return err
}

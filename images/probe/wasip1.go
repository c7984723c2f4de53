//go:build wasip1

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// The WASM backend runs this build as a WASI preview 1 module: there is no
// kernel interface to probe (no /proc, no capabilities, no syscalls beyond
// WASI's), so the probes are what a module can try: the network, host
// files, memory, the episode's disk, output and time.
func probes() []probe {
	return []probe{
		{"ping", ping},
		{"identity", identity},
		{"net-egress", netEgress},
		{"files", files},
		{"balloon", balloon},
		{"diskfill", diskfill},
		{"cpu", cpu},
		{"flood", flood},
	}
}

// isNoSpace accepts EIO too: wazero's WASI has no ENOSPC errno, so a full
// episode filesystem reaches a module as EIO (the host checks the size).
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EIO)
}

func identity(opts) finding {
	return finding{Pass: true, Evidence: "a WASI preview 1 module (GOOS=wasip1)", Data: map[string]any{"kernel": "wasi"}}
}

func netEgress(opts) finding {
	var n notes
	n.add("WASI preview 1 has no socket API (wazero grants no preopened sockets), so Go's net fails every dial")
	pass := true
	for _, a := range []string{"1.1.1.1:443", "8.8.8.8:53", "169.254.169.254:80"} {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
			n.add("%s: connected", a)
			pass = false
			continue
		}
		n.add("%s: %v", a, err)
	}
	if _, err := net.LookupHost("example.com"); err == nil {
		n.add("example.com resolved")
		pass = false
	} else {
		n.add("lookup example.com: %v", err)
	}
	return finding{Pass: pass, Evidence: n.String()}
}

// files tries host paths and escapes out of the episode's filesystem.
func files(opts) finding {
	var n notes
	pass := true
	for _, p := range []string{"/etc/passwd", "/etc/shadow", "/proc/self/status", "/proc/self/exe", "/../../../../etc/passwd", "/sys/kernel", "/var/run/docker.sock"} {
		_, err := os.Stat(p)
		switch {
		case err == nil:
			n.add("%s: exists", p)
			pass = false
		case errors.Is(err, fs.ErrNotExist):
			n.add("%s: absent", p)
		default:
			n.add("%s: %v", p, err)
		}
	}
	if entries, err := os.ReadDir("/"); err == nil {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		n.add("/ holds: %s", strings.Join(names, " "))
	}
	return finding{Pass: pass, Evidence: n.String()}
}

// balloon allocates and touches 16 MB chunks up to o.mb; the module's
// memory cap should stop it first (the Go runtime then dies).
func balloon(o opts) finding {
	const step = 16 << 20
	var held [][]byte
	for mb := 0; mb < o.mb; mb += step >> 20 {
		b := make([]byte, step)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		fmt.Fprintf(os.Stderr, "balloon %d MB\n", mb+step>>20)
	}
	return finding{Evidence: fmt.Sprintf("allocated and touched %d MB without being stopped", o.mb), Data: map[string]any{"mb": o.mb, "chunks": len(held)}}
}

// cpu spins for o.spinFor; a module is one thread, and the host measures
// what it cost.
func cpu(o opts) finding {
	start := time.Now()
	x := 0
	for time.Since(start) < o.spinFor {
		for i := 0; i < 100000; i++ {
			x += i
		}
	}
	return finding{Pass: true, Evidence: fmt.Sprintf("spun one thread for %v (the host measures the CPU time)", time.Since(start).Round(time.Millisecond)), Data: map[string]any{"x": x % 2}}
}

// Command probe is the program `rollbox audit` copies into a sandbox and runs
// there, once per probe: `probe NAME [flags]`. Each run tries one thing a
// hostile program would try (reach the network, keep a capability, write
// /proc/sys, fork without end, ...) and prints what it tried and what
// happened as one JSON object on stdout:
//
//	{"name": "caps", "pass": true, "evidence": "CapEff 0000000000000000, ...", "data": {...}}
//
// pass is the probe's own verdict where it can judge from inside; the host
// judges the rest (a probe killed by the OOM killer prints nothing, a flood
// is judged by what the host received) and adds what only it can see
// (hashes of the runtime binaries, a copy-out through a planted symlink).
//
// It is built static (CGO_ENABLED=0) for linux/amd64 by images.Builder, and
// for wasip1 for the WASM backend, where only the probes that mean something
// in a WASI module exist.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// finding is what one probe prints.
type finding struct {
	Name     string         `json:"name"`
	Pass     bool           `json:"pass"`
	Evidence string         `json:"evidence"`
	Data     map[string]any `json:"data,omitempty"`
}

// opts are the flags every probe may use.
type opts struct {
	pids     int           // forkbomb: the most tasks the sandbox may hold
	mb       int           // balloon, diskfill: how far to go, in MB
	limitMB  int           // diskfill: the size limit to check against
	dir      string        // diskfill, plant: where
	cpus     float64       // cpu: the quota to check against
	spinFor  time.Duration // cpu: how long to spin
	bytes    int64         // flood: how much to write
	gateways string        // net-gateway: extra addresses to try, comma-separated host:port
	forge    bool          // guest: write forged replies into the guest's stream when it is reachable
	how      string        // break-guest: kill, stop or garble
}

// probe is one named probe.
type probe struct {
	name string
	run  func(o opts) finding
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o opts
	fs.IntVar(&o.pids, "max-tasks", 0, "forkbomb: the most tasks the sandbox may hold at once")
	fs.IntVar(&o.mb, "mb", 0, "balloon, diskfill: how many MB to try")
	fs.IntVar(&o.limitMB, "limit-mb", 0, "diskfill: the size limit in MB")
	fs.StringVar(&o.dir, "dir", "/work", "diskfill, plant: directory")
	fs.Float64Var(&o.cpus, "cpus", 1, "cpu: the CPU quota")
	fs.DurationVar(&o.spinFor, "for", time.Second, "cpu: how long to spin")
	fs.Int64Var(&o.bytes, "bytes", 1<<30, "flood: bytes to write to stdout")
	fs.StringVar(&o.gateways, "gateways", "", "net-gateway: extra host:port addresses to try")
	fs.BoolVar(&o.forge, "forge", false, "guest: write forged replies when the guest's stream is reachable")
	fs.StringVar(&o.how, "how", "", "break-guest: kill (SIGKILL to PID 1), stop (SIGSTOP to PID 1), garble (junk into /proc/1/fd/1), limits (PID 1's RLIMIT_NOFILE to 3), cpu (PID 1's RLIMIT_CPU to 0) or panic (a panic line into /proc/1/fd/2, then SIGKILL to PID 1)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	for _, p := range probes() {
		if p.name == name {
			f := p.run(o)
			f.Name = name
			out, _ := json.Marshal(f)
			os.Stdout.Write(append(out, '\n'))
			return
		}
	}
	fmt.Fprintf(os.Stderr, "probe: unknown probe %q\n", name)
	usage()
	os.Exit(2)
}

func usage() {
	var names []string
	for _, p := range probes() {
		names = append(names, p.name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: probe NAME [flags]; probes: %s\n", strings.Join(names, " "))
}

// notes collects evidence lines.
type notes []string

func (n *notes) add(format string, args ...any) { *n = append(*n, fmt.Sprintf(format, args...)) }

func (n notes) String() string { return strings.Join(n, "; ") }

// ping answers, so the host can tell the sandbox still works.
func ping(opts) finding { return finding{Pass: true, Evidence: "answered"} }

// flood writes o.bytes to stdout as fast as it can; the host judges what
// arrived.
func flood(o opts) finding {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = 'A' + byte(i%26)
	}
	var written int64
	start := time.Now()
	for written < o.bytes {
		n := int64(len(buf))
		if o.bytes-written < n {
			n = o.bytes - written
		}
		k, err := os.Stdout.Write(buf[:n])
		written += int64(k)
		if err != nil {
			fmt.Fprintf(os.Stderr, "probe flood: write after %d bytes: %v\n", written, err)
			break
		}
	}
	fmt.Fprintf(os.Stderr, "probe flood: wrote %d bytes in %v\n", written, time.Since(start).Round(time.Millisecond))
	os.Exit(0)
	return finding{}
}

// diskfill writes 1 MB chunks into o.dir until the filesystem refuses, and
// passes when it refused with ENOSPC at or below the limit.
func diskfill(o opts) finding {
	var n notes
	p := o.dir + "/.rollbox-probe-fill"
	f, err := os.Create(p)
	if err != nil {
		return finding{Evidence: fmt.Sprintf("create %s: %v", p, err)}
	}
	defer os.Remove(p)
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	var written int64
	var werr error
	for written < int64(o.mb)<<20 {
		k, err := f.Write(buf)
		written += int64(k)
		if err != nil {
			werr = err
			break
		}
	}
	if werr == nil {
		werr = f.Sync()
	}
	mb := float64(written) / (1 << 20)
	n.add("wrote %.1f MB to %s before: %v", mb, p, errOrNone(werr))
	full := werr != nil && isNoSpace(werr)
	pass := full && mb <= float64(o.limitMB)+1
	if !full {
		n.add("not stopped by a full filesystem (limit %d MB)", o.limitMB)
	} else if !pass {
		n.add("stopped above the %d MB limit", o.limitMB)
	}
	return finding{Pass: pass, Evidence: n.String(), Data: map[string]any{"written_mb": mb, "limit_mb": o.limitMB}}
}

func errOrNone(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

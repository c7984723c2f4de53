// Package proc reads what Linux's /proc says of a process: its peak
// resident memory and its CPU time, for the service's metrics and the load
// generator's reports.
package proc

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// PeakRSS reads VmHWM of /proc/<pid>/status ("self" for this process), in
// bytes; 0 when it cannot.
func PeakRSS(pid string) int64 { return statusBytes(pid, "VmHWM:") }

// RSS reads VmRSS of /proc/<pid>/status (its resident memory now), in
// bytes; 0 when it cannot.
func RSS(pid string) int64 { return statusBytes(pid, "VmRSS:") }

// StatusBytes is a "KEY: N kB" line of /proc/PID/status in bytes (key with
// its colon, "RssAnon:"); 0 when it cannot be read.
func StatusBytes(pid, key string) int64 { return statusBytes(pid, key) }

func statusBytes(pid, key string) int64 {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			if f := strings.Fields(rest); len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// CPUSeconds is a process's user+system CPU time so far ("self" for this
// one); 0 when it cannot be read.
func CPUSeconds(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces): state is 3rd,
	// utime the 14th and stime the 15th field of the line.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

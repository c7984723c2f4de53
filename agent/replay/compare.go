package replay

import (
	"fmt"
	"maps"
	"regexp"
	"slices"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/textdiff"
)

// FieldDiff is one way a replayed tool result differs from the recorded one.
type FieldDiff struct {
	// Field is the trajectory's name for it: exit_code, output, stdout,
	// stderr, files[/work/x.py], error_kind, ...
	Field    string `json:"field"`
	Recorded string `json:"recorded"`
	Replayed string `json:"replayed"`
	// Diff is a unified diff of a text field.
	Diff string `json:"diff,omitempty"`
	// Hint suggests what to do about it (timings that differ).
	Hint string `json:"hint,omitempty"`
}

// durationRes match wall-clock durations and clock times as test runners
// and tools print them, with what replaces each: pytest's "in 0.02s" and
// "in 62.30s (0:01:02)" (the suffix it adds past a minute), go test's "ok
// pkg 0.123s", "ok pkg (cached)" and "--- PASS: TestX (0.00s)", time(1) in
// its forms (bash's "real 0m0.01s", POSIX -p's "real 0.01", busybox's "real
// 0m 0.00s", GNU's "0.00user 0.00system 0:00.01elapsed 95%CPU" and -v's
// lines, zsh's "0.01s user ... 92% cpu 0.031 total"), Go's "1m2.5s",
// "Ran 3 tests in 0.001s", "Time: 1.234 s", "(12ms)", timeit's "46.4 nsec",
// "2 minutes" and times of day ("12:34:56"). Nothing can pin wall time, so
// replay masks them before comparing unless Options.Strict. Counts beside
// them (tests passed, coverage, memory) stay compared.
var durationRes = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\b\d+:\d{2}:\d{2}(\.\d+)?\b`), "<duration>"},                // 0:01:02, 12:34:56.789
	{regexp.MustCompile(`\b(\d+:)?\d+:\d{2}(\.\d+)?elapsed\b`), "<duration>elapsed"}, // GNU time
	{regexp.MustCompile(`\b\d+(\.\d+)?(user|system)\b`), "<duration>$2"},             // GNU time
	{regexp.MustCompile(`\b\d+%(CPU|\scpu)\b`), "<cpu>%$1"},                          // GNU time, zsh
	{regexp.MustCompile(`\b\d+:\d{2}\.\d+\b`), "<duration>"},                         // 1:02.31 (GNU time -v: m:ss)
	{regexp.MustCompile(`\b(User|System) time \(seconds\): \d+(\.\d+)?`), "$1 time (seconds): <duration>"},
	{regexp.MustCompile(`\bPercent of CPU this job got: \d+%`), "Percent of CPU this job got: <cpu>%"},
	{regexp.MustCompile(`(?m)^(real|user|sys)([ \t]+)\d+(\.\d+)?$`), "$1$2<duration>"}, // time -p
	{regexp.MustCompile(`\b\d+\.\d+ total\b`), "<duration> total"},                     // zsh
	{regexp.MustCompile(`\b\d+m\s?\d+(\.\d+)?s\b`), "<duration>"},                      // 0m0.01s (time), 0m 0.00s (busybox), 1m2.5s (Go)
	{regexp.MustCompile(`\b(\d+h)?(\d+m)?\d+(\.\d+)?\s?(ns|nsec|µs|us|usec|ms|msec|s|sec|secs|second|seconds|min|mins|minute|minutes|hour|hours)\b`), "<duration>"},
	{regexp.MustCompile(`\(cached\)`), "<duration>"},                // go test: a cached package's result
	{regexp.MustCompile(`<duration> \(<duration>\)`), "<duration>"}, // pytest: "in 62.30s (0:01:02)"
}

// maskDurations replaces every duration in s with "<duration>" (and a
// share of CPU with "<cpu>").
func maskDurations(s string) string {
	for _, d := range durationRes {
		s = d.re.ReplaceAllString(s, d.repl)
	}
	return s
}

// compareTool compares a replayed tool step with the recorded one. Text is
// compared after masking what ignore matches and, unless strict, wall-clock
// durations: durationsDiffer reports text that matched only with its
// durations masked. Durations and start times of the steps themselves are
// not compared; stdout and stderr only when the recording kept them.
func compareTool(rec, got trajectory.Step, ignore []*regexp.Regexp, strict bool) (out []FieldDiff, durationsDiffer bool) {
	scalar := func(field, a, b string) {
		if a != b {
			out = append(out, FieldDiff{Field: field, Recorded: a, Replayed: b})
		}
	}
	text := func(field, a, b string) {
		a, b = mask(a, ignore), mask(b, ignore)
		if a == b {
			return
		}
		if !strict && maskDurations(a) == maskDurations(b) {
			durationsDiffer = true
			return
		}
		name := fmt.Sprintf("step %d %s", rec.Index, field)
		fd := FieldDiff{Field: field, Recorded: abbrev(a), Replayed: abbrev(b),
			Diff: textdiff.Unified(a, b, "recorded "+name, "replayed "+name, 3)}
		if strict && maskDurations(a) == maskDurations(b) {
			fd.Hint = "only wall-clock durations differ: nothing can pin them; without --strict they are masked"
		}
		out = append(out, fd)
	}
	scalar("name", rec.Name, got.Name)
	scalar("error_kind", kind(rec.ErrorKind), kind(got.ErrorKind))
	scalar("exit_code", intp(rec.ExitCode), intp(got.ExitCode))
	scalar("signal", rec.Signal, got.Signal)
	scalar("timed_out", fmt.Sprint(rec.TimedOut), fmt.Sprint(got.TimedOut))
	scalar("oom_killed", fmt.Sprint(rec.OOMKilled), fmt.Sprint(got.OOMKilled))
	text("output", rec.Output, got.Output)
	scalar("truncated", fmt.Sprint(rec.Truncated), fmt.Sprint(got.Truncated))
	if len(ignore) == 0 && !durationsDiffer {
		// (Masked text may differ in length: a cap then drops other counts.)
		scalar("bytes_dropped", fmt.Sprint(rec.BytesDropped), fmt.Sprint(got.BytesDropped))
	}
	if rec.Stdout != nil {
		text("stdout", string(*rec.Stdout), bytesOf(got.Stdout))
	}
	if rec.Stderr != nil {
		text("stderr", string(*rec.Stderr), bytesOf(got.Stderr))
	}
	paths := slices.Sorted(maps.Keys(rec.Files))
	for p := range got.Files {
		if _, ok := rec.Files[p]; !ok {
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		scalar("files["+p+"] sha256", orNone(rec.Files[p]), orNone(got.Files[p]))
	}
	return out, durationsDiffer
}

func mask(s string, ignore []*regexp.Regexp) string {
	for _, re := range ignore {
		s = re.ReplaceAllString(s, "<ignored>")
	}
	return s
}

func kind(k *string) string {
	if k == nil {
		return "null"
	}
	return *k
}

func intp(p *int) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func bytesOf(b *trajectory.Bytes) string {
	if b == nil {
		return ""
	}
	return string(*b)
}

func orNone(s string) string {
	if s == "" {
		return "(not written)"
	}
	return s
}

// abbrev shortens a text for a one-line summary.
func abbrev(s string) string {
	const n = 120
	r := []rune(s)
	if len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// Text writes a replay's report for people, step by step as it goes. Color
// adds ANSI colours (for a terminal).
type Text struct {
	W     io.Writer
	Color bool
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiDim    = "\x1b[2m"
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiCyan   = "\x1b[36m"
)

func (t Text) c(code, s string) string {
	if !t.Color {
		return s
	}
	return code + s + ansiReset
}

// Header describes what is about to be replayed.
func (t Text) Header(tr *trajectory.Trajectory, image string, notes []string) {
	fmt.Fprintf(t.W, "%s %s\n", t.c(ansiBold, "replaying"), tr.EpisodeID)
	fmt.Fprintf(t.W, "  task      %s (%d steps, recorded %s, ended %s)\n", tr.TaskID, len(tr.Steps),
		tr.StartedAt.UTC().Format("2006-01-02 15:04:05 UTC"), endReason(tr))
	sb := tr.Sandbox
	desc := sb.Backend
	if image != "" {
		desc += " · image " + image
	}
	if sb.Runtime != "" {
		desc += " · runtime " + sb.Runtime
	}
	if sb.Network != "" {
		desc += " · network " + sb.Network
	}
	var l sandbox.Limits
	if len(sb.Limits) > 0 && json.Unmarshal(sb.Limits, &l) == nil {
		desc += fmt.Sprintf(" · cpus %g · memory %d MB · pids %d · disk %d MB · tmp %d MB · exec timeout %v",
			l.CPUs, l.MemoryMB, l.PIDs, l.DiskMB, l.TmpMB, l.ExecTimeout)
	}
	fmt.Fprintf(t.W, "  sandbox   %s\n", desc)
	if len(tr.Pinned) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(tr.Pinned)) {
			kv = append(kv, k+"="+tr.Pinned[k])
		}
		fmt.Fprintf(t.W, "  pinned    %s\n", strings.Join(kv, " "))
	}
	for _, n := range notes {
		fmt.Fprintf(t.W, "  %s      %s\n", t.c(ansiYellow, "note"), n)
	}
}

// Step writes one replayed step on a line.
func (t Text) Step(s StepReport) {
	if s.Type == trajectory.StepModel {
		line := fmt.Sprintf("  #%-3d model turn %d", s.Index, s.Turn)
		if s.Content != "" {
			line += ": " + oneLine(s.Content, 60)
		}
		if s.Arguments != "" {
			line += " → " + s.Arguments
		}
		if s.Live {
			line += "  (live)"
		}
		fmt.Fprintln(t.W, t.c(ansiDim, line))
		return
	}
	call := fmt.Sprintf("%s %s", s.Name, oneLine(s.Arguments, 60))
	res := "ok"
	if s.ExitCode != nil {
		res = fmt.Sprintf("exit %d", *s.ExitCode)
	}
	if s.ErrorKind != "" {
		res += " · " + s.ErrorKind
	}
	verdict := t.c(ansiGreen, "same")
	switch {
	case s.Match && s.DurationsDiffer:
		verdict = t.c(ansiGreen, "matched (durations differ)")
	case s.Live:
		verdict = t.c(ansiCyan, "live")
	case !s.Match:
		verdict = t.c(ansiRed+ansiBold, "DIVERGED")
	}
	timing := fmt.Sprintf("%s → %s", ms(s.RecordedMS), ms(s.ReplayedMS))
	if s.Live {
		timing = ms(s.ReplayedMS)
	}
	fmt.Fprintf(t.W, "  #%-3d %-64s %-22s %s  %s\n", s.Index, call, res, verdict, t.c(ansiDim, timing))
}

// Summary writes how the replay ended and, for a divergence, what differed.
func (t Text) Summary(r *Report) {
	if r.Recorded != nil && r.Replayed != nil {
		fmt.Fprintf(t.W, "  end       recorded %s, reward %s · replayed %s, reward %s\n",
			r.Recorded.Reason, rewardText(r.Recorded.Reward), r.Replayed.Reason, rewardText(r.Replayed.Reward))
	} else if r.Replayed != nil {
		fmt.Fprintf(t.W, "  end       %s, reward %s (live)\n", r.Replayed.Reason, rewardText(r.Replayed.Reward))
	}
	tools := 0
	for _, s := range r.Steps {
		if s.Type == trajectory.StepTool && !s.Live {
			tools++
		}
	}
	if d := r.Divergence; d != nil {
		where := fmt.Sprintf("step %d", d.Index)
		if d.Type == trajectory.StepTool {
			where += fmt.Sprintf(" (turn %d, %s %s)", d.Turn, d.Name, oneLine(d.Arguments, 80))
		} else if d.Type == "end" {
			where = "the end of the episode"
		}
		fmt.Fprintf(t.W, "\n%s at %s:\n", t.c(ansiRed+ansiBold, "first divergence"), where)
		for _, f := range d.Diffs {
			if f.Diff != "" {
				fmt.Fprintf(t.W, "  %s differs:\n", f.Field)
				for _, line := range strings.SplitAfter(strings.TrimSuffix(f.Diff, "\n"), "\n") {
					t.diffLine(strings.TrimSuffix(line, "\n"))
				}
				if f.Hint != "" {
					fmt.Fprintf(t.W, "  %s %s\n", t.c(ansiYellow, "hint:"), f.Hint)
				}
				continue
			}
			fmt.Fprintf(t.W, "  %-20s recorded %s, replayed %s\n", f.Field, t.c(ansiRed, f.Recorded), t.c(ansiGreen, f.Replayed))
		}
		fmt.Fprintf(t.W, "\n%s\n", r.StopDetail)
		return
	}
	msg := fmt.Sprintf("no divergence: %d tool call(s) gave the recorded results", tools)
	if n := durationsDiffered(r); n > 0 {
		msg += fmt.Sprintf(" (%d matched with other wall-clock durations, which are masked; --strict compares them too)", n)
	}
	fmt.Fprintf(t.W, "\n%s; %s\n", t.c(ansiGreen+ansiBold, msg), r.StopDetail)
}

// durationsDiffered counts the steps that matched with durations masked.
func durationsDiffered(r *Report) int {
	n := 0
	for _, s := range r.Steps {
		if s.DurationsDiffer {
			n++
		}
	}
	return n
}

func (t Text) diffLine(line string) {
	code := ""
	switch {
	case strings.HasPrefix(line, "---"), strings.HasPrefix(line, "+++"):
		code = ansiBold
	case strings.HasPrefix(line, "@@"):
		code = ansiCyan
	case strings.HasPrefix(line, "-"):
		code = ansiRed
	case strings.HasPrefix(line, "+"):
		code = ansiGreen
	}
	if code == "" {
		fmt.Fprintf(t.W, "    %s\n", line)
		return
	}
	fmt.Fprintf(t.W, "    %s\n", t.c(code, line))
}

func endReason(tr *trajectory.Trajectory) string {
	if tr.Termination == nil {
		return "?"
	}
	return tr.Termination.Reason
}

func ms(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.2fms", v)
	case v < 1000:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.1fs", v/1000)
	}
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

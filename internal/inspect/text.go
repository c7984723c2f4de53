// Package inspect shows trajectories to people: Render writes one as a
// terminal view (turns, tool calls, outputs abbreviated, errors and
// truncations highlighted, context events, the end and the reward), and
// Server serves a run's episodes as a web page embedded in the binary, with
// a small JSON API (rollbox inspect --serve).
package inspect

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/tools"
)

// Options tune Render.
type Options struct {
	// Color adds ANSI colours (for a terminal).
	Color bool
	// Lines is how many lines of each output to show (head and tail); 0
	// shows them all.
	Lines int
}

const (
	reset  = "\x1b[0m"
	bold   = "\x1b[1m"
	dim    = "\x1b[2m"
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	blue   = "\x1b[34m"
	cyan   = "\x1b[36m"
)

type printer struct {
	w    io.Writer
	opts Options
	// esc stands for ESC in the view's own colour codes until the output
	// filter (escaper) turns it back into ESC: a fresh random token per
	// Render, which no recorded text can contain.
	esc string
}

func (p printer) c(code, s string) string {
	if !p.opts.Color || s == "" {
		return s
	}
	return strings.ReplaceAll(code, "\x1b", p.esc) + s + strings.ReplaceAll(reset, "\x1b", p.esc)
}

func (p printer) f(format string, args ...any) { fmt.Fprintf(p.w, format, args...) }

// Render writes t as a terminal view. Everything the episode recorded
// (outputs, the model's text, arguments, messages, ids) is untrusted: its
// control characters are shown escaped (\x1b, \r, \u202e, ...), so no escape
// sequence, C1 control or bidirectional override it carries reaches the
// terminal; the view's own colours are the only escapes written.
func Render(w io.Writer, t *trajectory.Trajectory, opts Options) {
	var nonce [16]byte
	rand.Read(nonce[:])
	p := printer{w: &escaper{w: w, esc: "\ue000" + hex.EncodeToString(nonce[:]) + "\ue001"}, opts: opts}
	p.esc = p.w.(*escaper).esc
	p.f("%s %s\n", p.c(bold, "episode"), p.c(bold, t.EpisodeID))
	p.f("  task      %s · group %s #%d · seed %d\n", t.TaskID, t.GroupID, t.GroupIndex, t.Seed)
	p.f("  sandbox   %s\n", sandboxLine(t.Sandbox))
	pol := t.Policy.Kind
	if t.Policy.Model != "" {
		pol += " · model " + t.Policy.Model
	}
	if t.Policy.Endpoint != "" {
		pol += " · " + t.Policy.Endpoint
	}
	p.f("  policy    %s\n", pol)
	if imp := t.Import; imp != nil {
		p.f("  source    %s · imported %s as %s · id %s · policy version %s · grouped by %s\n", p.c(bold, trajectory.SourceOf(t)),
			imp.ImportedAt.UTC().Format("2006-01-02 15:04:05 UTC"), imp.Format, imp.ExternalID, imp.PolicyVersion, imp.GroupBy)
	} else {
		p.f("  source    %s\n", trajectory.SourceOf(t))
	}
	if len(t.Redactions) > 0 {
		var parts []string
		for _, r := range t.Redactions {
			parts = append(parts, fmt.Sprintf("%s ×%d at %s", r.Kind, r.Count, r.Path))
		}
		p.f("  redacted  %s\n", p.c(yellow, strings.Join(parts, " · ")))
	}
	if pa := t.Parent; pa != nil {
		p.f("  parent    %s step %d · stage %d sub-agent %d · frozen (never trained on, never rewarded)\n", pa.EpisodeID, pa.Step, pa.Stage, pa.Index)
	}
	st := t.Stats
	p.f("  ran       %s · %s · %d turns · %d tool calls · %s prompt + %s completion tokens\n",
		t.StartedAt.UTC().Format("2006-01-02 15:04:05 UTC"), dur(st.DurationMS), st.Turns, st.ToolCalls,
		count(st.PromptTokens), count(st.CompletionTokens))
	if n := sumCounts(st.ToolErrors); n > 0 {
		p.f("  errors    %s\n", p.c(red, countsLine(st.ToolErrors)))
	}
	if len(t.Pinned) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(t.Pinned)) {
			kv = append(kv, k+"="+t.Pinned[k])
		}
		p.f("  pinned    %s\n", p.c(dim, strings.Join(kv, " ")))
	}

	events := map[int][]trajectory.ContextEvent{}
	for _, e := range t.ContextEvents {
		events[e.Step] = append(events[e.Step], e)
	}
	for _, s := range t.Steps {
		p.f("\n")
		switch s.Type {
		case trajectory.StepModel:
			p.model(s)
		case trajectory.StepUser:
			who := "user"
			if s.Name != "" {
				who = s.Name
			}
			p.f("%s %s\n", p.c(bold, who), p.c(dim, fmt.Sprintf("#%d", s.Index)))
			p.block(strings.TrimSpace(s.Content), "  ", "")
		default:
			p.tool(s)
		}
		for _, e := range events[s.Index] {
			p.event(e)
		}
	}
	p.f("\n")
	p.end(t)
	p.outcomes(t)
	p.monitors(t)
	p.tree(t)
}

// tree prints an orchestrator episode's sub-agents by stage, each stage's
// longest (the critical path) starred, and its critical steps.
func (p printer) tree(t *trajectory.Trajectory) {
	st := t.Stats
	if st.CriticalSteps == nil {
		return
	}
	total := 0
	if st.TotalSteps != nil {
		total = *st.TotalSteps
	}
	p.f("%s  %d critical steps of %d (%d orchestrator turns + the longest sub-agent of each stage)\n", p.c(bold, "sub-agents"), *st.CriticalSteps, total, st.Turns)
	for i, sa := range t.Subagents {
		if i == 0 || t.Subagents[i-1].Stage != sa.Stage {
			p.f("  stage %d (step %d)\n", sa.Stage, sa.Step)
		}
		star := " "
		if sa.Critical {
			star = p.c(bold, "*")
		}
		answer := oneLine(sa.Answer, 60)
		if sa.Truncated {
			answer += fmt.Sprintf(" [cut: %d of %d bytes shown]", len(sa.Answer), sa.AnswerBytes)
		}
		p.f("   %s #%d %-14s %2d steps  %s  %s\n", star, sa.Index, sa.End, sa.Steps, oneLine(sa.Prompt, 50), p.c(dim, answer))
	}
}

// outcomes prints an imported episode's outcome status and signals.
func (p printer) outcomes(t *trajectory.Trajectory) {
	o := t.Outcomes
	if o == nil {
		return
	}
	status := p.c(yellow+bold, "pending") + " until " + o.MaturesAt.UTC().Format("2006-01-02 15:04:05 UTC")
	if o.Status == trajectory.OutcomeScored {
		status = p.c(green+bold, "scored")
		if o.ScoredAt != nil {
			status += " at " + o.ScoredAt.UTC().Format("2006-01-02 15:04:05 UTC")
		}
	}
	p.f("%s  %s · %d signal(s)\n", p.c(bold, "outcomes"), status, len(o.Signals))
	for _, s := range o.Signals {
		line := fmt.Sprintf("%-14s %8.3f", s.Name, s.Value)
		if len(s.Raw) > 0 {
			line += " (" + string(s.Raw) + ")"
		}
		if s.At != "" {
			line += " at " + s.At
		}
		if s.Source != "" {
			line += " from " + s.Source
		}
		if s.Late {
			line += " " + p.c(dim, "late: not in the reward")
		}
		p.f("          %s\n", line)
	}
}

func (p printer) model(s trajectory.Step) {
	meta := []string{dur(s.DurationMS)}
	if s.Usage != nil {
		u := fmt.Sprintf("%s+%s tokens", count(s.Usage.PromptTokens), count(s.Usage.CompletionTokens))
		if s.Usage.Estimated {
			u += " (est.)"
		}
		meta = append(meta, u)
	}
	if s.FinishReason != "" {
		meta = append(meta, s.FinishReason)
	}
	if s.Attempts > 1 {
		meta = append(meta, p.c(yellow, fmt.Sprintf("%d attempts", s.Attempts)))
	}
	p.f("%s %s  %s\n", p.c(blue+bold, fmt.Sprintf("turn %d", s.Turn)), p.c(dim, fmt.Sprintf("#%d model", s.Index)), p.c(dim, strings.Join(meta, " · ")))
	if c := strings.TrimSpace(s.Content); c != "" {
		p.block(c, "  ", "")
	}
	for _, c := range s.ToolCalls {
		p.f("  %s %s %s\n", p.c(cyan, "→"), p.c(bold, c.Name), oneLine(compact(c.Arguments), 160))
	}
	if s.ToolCallsFromText {
		p.f("  %s\n", p.c(dim, "(tool calls parsed from the text)"))
	}
}

func (p printer) tool(s trajectory.Step) {
	status := p.c(green, "ok")
	if s.ExitCode != nil {
		status = fmt.Sprintf("exit %d", *s.ExitCode)
		if *s.ExitCode == 0 {
			status = p.c(green, status)
		} else {
			status = p.c(red, status)
		}
	}
	var badges []string
	if s.ErrorKind != nil {
		code := red
		if *s.ErrorKind == string(tools.KindOutputTruncated) {
			code = yellow
		}
		badges = append(badges, p.c(code+bold, *s.ErrorKind))
	}
	if s.Truncated && (s.ErrorKind == nil || *s.ErrorKind != string(tools.KindOutputTruncated)) {
		badges = append(badges, p.c(yellow+bold, "truncated"))
	}
	if s.BytesDropped > 0 {
		badges = append(badges, p.c(yellow, fmt.Sprintf("%d bytes dropped", s.BytesDropped)))
	}
	if s.TimedOut {
		badges = append(badges, p.c(red, "timed out"))
	}
	if s.OOMKilled {
		badges = append(badges, p.c(red, "OOM-killed"))
	}
	if s.Signal != "" {
		badges = append(badges, p.c(red, s.Signal))
	}
	p.f("  %s %s %s  %s %s  %s\n", p.c(dim, fmt.Sprintf("#%d", s.Index)), p.c(bold, s.Name), oneLine(compact(string(s.Arguments)), 120),
		status, strings.Join(badges, " "), p.c(dim, dur(s.DurationMS)))
	if s.Error != "" && (s.ErrorKind == nil || *s.ErrorKind != string(tools.KindNonzeroExit)) {
		p.f("    %s %s\n", p.c(red, "error:"), s.Error)
	}
	for _, path := range slices.Sorted(maps.Keys(s.Files)) {
		p.f("    %s %s %s\n", p.c(dim, "wrote"), path, p.c(dim, "sha256:"+s.Files[path][:min(12, len(s.Files[path]))]))
	}
	if s.Output != "" {
		p.block(s.Output, "    ", "│ ")
	}
}

func (p printer) event(e trajectory.ContextEvent) {
	code := dim
	switch e.Kind {
	case "tool_output_truncated", "context_truncated", "pruned":
		code = yellow
	case "context_overflow", "prune_refused", "read_refused":
		code = red
	}
	detail := e.Detail
	if len(e.IDs) > 0 {
		detail = strings.TrimSpace(detail + " [" + oneLine(strings.Join(e.IDs, ", "), 100) + "]")
	}
	p.f("    %s %s\n", p.c(code, "◆ "+e.Kind), p.c(dim, detail))
}

func (p printer) end(t *trajectory.Trajectory) {
	if term := t.Termination; term != nil {
		code := green
		if !trajectory.Scored(term.Reason) {
			code = red
		} else if term.Reason != trajectory.EndFinished {
			code = yellow
		}
		line := p.c(code+bold, term.Reason) + fmt.Sprintf(" at step %d", term.Step)
		if term.Answer != nil {
			line += fmt.Sprintf(" · answer %q", oneLine(*term.Answer, 100))
		}
		if len(term.IDs) > 0 {
			line += " · ids " + oneLine(strings.Join(term.IDs, ", "), 100)
		}
		p.f("%s       %s\n", p.c(bold, "end"), line)
		if term.Message != "" {
			p.f("          %s\n", term.Message)
		}
	} else {
		p.f("%s       %s\n", p.c(bold, "end"), p.c(yellow, "none recorded"))
	}
	r := t.Reward
	if r == nil {
		p.f("%s    %s\n", p.c(bold, "reward"), p.c(dim, "none (not scored)"))
		return
	}
	if total, ok := r.Value(); ok {
		code := green
		if total <= 0 {
			code = red
		} else if total < 1 {
			code = yellow
		}
		p.f("%s    %s  %s\n", p.c(bold, "reward"), p.c(code+bold, fmt.Sprintf("%.3f", total)), bar(total, 20))
	} else {
		p.f("%s    %s\n", p.c(bold, "reward"), p.c(yellow+bold, "none (unscored: "+r.ErrorKind+")"))
	}
	for _, k := range slices.Sorted(maps.Keys(r.Components)) {
		p.f("          %-22s %8.3f  %s\n", k, r.Components[k], p.c(dim, bar(r.Components[k], 20)))
	}
	for _, d := range r.Details {
		p.f("          %s\n", p.c(dim, d))
	}
	if v := r.Verifier; v != nil {
		status := fmt.Sprintf("exit %d", v.ExitCode)
		if v.ExitCode == 0 {
			status = p.c(green, status)
		} else {
			status = p.c(red, status)
		}
		if v.TimedOut {
			status += " " + p.c(red, "timed out")
		}
		p.f("%s  %s → %s  %s\n", p.c(bold, "verifier"), v.Command, status, p.c(dim, dur(v.DurationMS)))
		if len(v.Restored) > 0 {
			p.f("          restored %s\n", strings.Join(v.Restored, ", "))
		}
		if len(v.Removed) > 0 {
			p.f("          removed %s\n", p.c(yellow, strings.Join(v.Removed, ", ")))
		}
		if v.CleanRoom {
			p.f("          clean room: %d of the agent's files copied, %d deleted, %d hidden tests added\n", len(v.Copied), len(v.Deleted), len(v.Added))
		}
		for _, sk := range v.Skipped {
			p.f("          skipped %s: %s\n", p.c(yellow, sk.Path), sk.Reason)
		}
		if t := v.Tests; t != nil {
			p.f("          %s report: %d tests, %d passed, %d failed, %d skipped\n", v.Report, t.Total, t.Passed, t.Failed, t.Skipped)
		}
		if len(v.Missing) > 0 {
			p.f("          missing %s\n", p.c(red, strings.Join(v.Missing, ", ")))
		}
		if len(v.Failing) > 0 {
			p.f("          not passed %s\n", p.c(red, strings.Join(v.Failing, ", ")))
		}
		if v.Blame != "" {
			p.f("          scored 0: %s\n", p.c(red, v.Blame))
		}
		var out strings.Builder
		if v.Stdout != nil {
			out.Write(*v.Stdout)
		}
		if v.Stderr != nil && len(*v.Stderr) > 0 {
			if out.Len() > 0 && !strings.HasSuffix(out.String(), "\n") {
				out.WriteByte('\n')
			}
			out.WriteString("[stderr]\n")
			out.Write(*v.Stderr)
		}
		if out.Len() > 0 {
			p.block(out.String(), "    ", "│ ")
		}
	}
	if j := r.Judge; j != nil {
		score := p.c(yellow+bold, "unscored")
		if j.Score != nil {
			score = fmt.Sprintf("%.3f", *j.Score)
		}
		p.f("%s    %s  %s over judges, %d answer(s), %d cached, spread %.2f, %s\n", p.c(bold, "judges"), score, j.Aggregate, j.Calls, j.CacheHits, j.Spread, p.c(dim, dur(j.DurationMS)))
		if j.Error != "" {
			p.f("          %s\n", p.c(red, j.Error))
		}
		for _, jr := range j.Rubrics {
			v := "  -  "
			if jr.Score != nil {
				v = fmt.Sprintf("%.3f", *jr.Score)
			}
			var by []string
			for _, k := range slices.Sorted(maps.Keys(jr.ByJudge)) {
				by = append(by, fmt.Sprintf("%s %.2f", k, jr.ByJudge[k]))
			}
			p.f("          %-22s %8s  ×%g  %s\n", jr.Name, v, jr.Weight, p.c(dim, strings.Join(by, " · ")))
		}
		for _, js := range j.Judges {
			for _, rs := range js.Rubrics {
				for i, s := range rs.Samples {
					what := p.c(red, "failed: "+oneLine(s.Error, 120))
					if s.Score != nil {
						what = fmt.Sprintf("%s → %.2f  %s", s.Raw, *s.Score, p.c(dim, oneLine(s.Reason, 100)))
					}
					p.f("          %s/%s#%d  %s\n", js.Name, rs.Rubric, i+1, what)
				}
			}
		}
	}
}

// monitors prints the monitors that apply, fired ones in red.
func (p printer) monitors(t *trajectory.Trajectory) {
	v := t.Monitors.Values()
	if len(v) == 0 {
		return
	}
	var parts []string
	for _, name := range trajectory.MonitorNames() {
		n, ok := v[name]
		if !ok {
			continue
		}
		s := fmt.Sprintf("%s %d", name, n)
		if n > 0 {
			s = p.c(red+bold, s)
		}
		parts = append(parts, s)
	}
	p.f("%s  %s\n", p.c(bold, "monitors"), strings.Join(parts, " · "))
}

// block writes text indented, abbreviated to its head and tail lines; a
// line marking a truncation or a kill is always shown.
func (p printer) block(text, indent, gutter string) {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	keep := make([]bool, len(lines))
	n := p.opts.Lines
	for i, l := range lines {
		keep[i] = n <= 0 || len(lines) <= n+1 || i < n-n/3 || i >= len(lines)-n/3 || marker(l)
	}
	for i := 0; i < len(lines); i++ {
		if !keep[i] {
			j := i
			for j < len(lines) && !keep[j] {
				j++
			}
			p.f("%s%s%s\n", indent, p.c(dim, gutter), p.c(dim+yellow, fmt.Sprintf("… %d more lines …", j-i)))
			i = j - 1
			continue
		}
		l := lines[i]
		if marker(l) {
			l = p.c(yellow, l)
		}
		p.f("%s%s%s\n", indent, p.c(dim, gutter), l)
	}
}

// marker reports a line the runtime added to say output was cut or a
// command was stopped.
func marker(l string) bool {
	return strings.HasPrefix(l, "[... output truncated") || strings.HasPrefix(l, "[timed out") ||
		strings.HasPrefix(l, "[killed") || strings.HasPrefix(l, "[stopped")
}

func sandboxLine(s trajectory.Sandbox) string {
	parts := []string{s.Backend}
	if s.Image != "" {
		parts = append(parts, "image "+s.Image)
	}
	if s.ImageDigest != "" {
		parts = append(parts, s.ImageDigest[:min(len(s.ImageDigest), 19)])
	}
	if s.Runtime != "" {
		parts = append(parts, "runtime "+s.Runtime)
	}
	if s.Network != "" {
		parts = append(parts, "network "+s.Network)
	}
	var l sandbox.Limits
	if len(s.Limits) > 0 && json.Unmarshal(s.Limits, &l) == nil {
		parts = append(parts, fmt.Sprintf("cpus %g · %d MB · pids %d", l.CPUs, l.MemoryMB, l.PIDs))
	}
	if len(s.Loosened) > 0 {
		parts = append(parts, "loosened: "+strings.Join(s.Loosened, ", "))
	}
	return strings.Join(parts, " · ")
}

func dur(ms float64) string {
	switch {
	case ms < 1:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0fms", ms)
	case ms < 60000:
		return fmt.Sprintf("%.1fs", ms/1000)
	default:
		return fmt.Sprintf("%.1fmin", ms/60000)
	}
}

func count(n int64) string {
	if n >= 10000 {
		return fmt.Sprintf("%.1fk", float64(n)/1000)
	}
	return fmt.Sprint(n)
}

func bar(v float64, width int) string {
	v = max(0, min(1, v))
	n := int(v*float64(width) + 0.5)
	return strings.Repeat("█", n) + strings.Repeat("░", width-n)
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func countsLine(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, " · ")
}

// compact is JSON text without its indentation (as the model wrote it,
// when it was compact), or the text as is.
func compact(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) == nil {
		return b.String()
	}
	return s
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// escaper is the view's output filter: it writes the printer's text with
// every control character escaped — C0 and C1 controls (ESC, BEL, CR, the
// 8-bit CSI), DEL, invalid UTF-8 bytes, Unicode format characters
// (bidirectional overrides and isolates, zero-width marks) and the line and
// paragraph separators — except newlines and tabs, and turns the printer's
// own colour token back into ESC. Each Write is a whole formatted line, so
// a token is never split.
type escaper struct {
	w   io.Writer
	esc string
	buf []byte
}

func (e *escaper) Write(p []byte) (int, error) {
	e.buf = appendEscaped(e.buf[:0], string(p), e.esc)
	if _, err := e.w.Write(e.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// appendEscaped appends s to b with its control characters escaped, and
// each occurrence of esc (the printer's token) as ESC.
func appendEscaped(b []byte, s, esc string) []byte {
	for i := 0; i < len(s); {
		if esc != "" && strings.HasPrefix(s[i:], esc) {
			b = append(b, 0x1b)
			i += len(esc)
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			b = append(b, `\x`...)
			b = append(b, hex.EncodeToString([]byte{s[i]})...)
		case r == '\n' || r == '\t':
			b = append(b, byte(r))
		case r == '\r':
			b = append(b, `\r`...)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029':
			if r < utf8.RuneSelf {
				b = fmt.Appendf(b, `\x%02x`, r) // \x1b, \x07, \x7f
			} else {
				b = fmt.Appendf(b, `\u%04x`, r) // \u009b, \u202e, \u2028
			}
		default:
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return b
}

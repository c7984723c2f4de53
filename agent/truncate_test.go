package agent_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/tools"
)

// markerNumbers finds the numbers the model is told: the truncation marker
// and the caps' markers.
var markerNumbers = regexp.MustCompile(`\n\[\.\.\. (?:output truncated: (\d+) bytes omitted|(\d+) bytes dropped) \.\.\.\]\n`)

// toolText is a tool text built from output and notes, with what it holds.
type toolText struct {
	text   string
	notes  []tools.Note
	output int64 // bytes of output: its own and what the notes stand for
}

func (b *toolText) out(s string) {
	b.text += s
	b.output += int64(len(s))
}

func (b *toolText) note(s string, stands int64) {
	b.notes = append(b.notes, tools.Note{Start: len(b.text), End: len(b.text) + len(s), Stands: stands})
	b.text += s
	b.output += stands
}

// shownOutput is how many bytes of output the model saw in a cut of b:
// the head and the tail are a prefix and a suffix of b.text (valid UTF-8
// here), less the notes among them, plus what the caps' markers among them
// stand for (each is also told).
func (b *toolText) check(t *testing.T, c agent.Cut, limit int) {
	t.Helper()
	if !utf8.ValidString(c.Text) {
		t.Fatalf("not valid UTF-8: %q", c.Text)
	}
	if len(c.Text) > limit {
		t.Errorf("%d bytes shown, over the limit %d", len(c.Text), limit)
	}
	told := int64(0)
	for _, m := range markerNumbers.FindAllStringSubmatch(c.Text, -1) {
		n, _ := strconv.ParseInt(m[1]+m[2], 10, 64)
		told += n
	}
	if told != c.Unseen {
		t.Errorf("the markers the model sees add up to %d, bytes_dropped is %d: %q", told, c.Unseen, c.Text)
	}
	headLen, tailLen := len(c.Text), 0
	if c.Truncated {
		i := strings.Index(c.Text, "\n[... output truncated: ")
		j := strings.Index(c.Text[i:], " bytes omitted ...]\n")
		if i < 0 || j < 0 {
			t.Fatalf("no truncation marker in %q", c.Text)
		}
		n, _ := strconv.ParseInt(c.Text[i+len("\n[... output truncated: "):i+j], 10, 64)
		if n != c.Omitted {
			t.Errorf("the marker says %d bytes omitted, Omitted is %d", n, c.Omitted)
		}
		headLen, tailLen = i, len(c.Text)-(i+j+len(" bytes omitted ...]\n"))
		if !strings.HasPrefix(b.text, c.Text[:headLen]) || !strings.HasSuffix(b.text, c.Text[len(c.Text)-tailLen:]) {
			t.Fatalf("head or tail is not the text's: %q", c.Text)
		}
	} else if c.Text != b.text {
		t.Fatalf("an uncut text changed: %q", c.Text)
	}
	shown := int64(headLen + tailLen)
	visible := func(from, to int) bool { // [from, to) lies in the head or the tail
		return to <= headLen || from >= len(b.text)-tailLen
	}
	for _, n := range b.notes {
		if visible(n.Start, n.End) {
			shown -= int64(n.End - n.Start)
		} else if n.End > headLen && n.Start < headLen || n.End > len(b.text)-tailLen && n.Start < len(b.text)-tailLen {
			t.Errorf("note %q was cut in two", b.text[n.Start:n.End])
		}
	}
	if want := b.output - shown; c.Unseen != want {
		t.Errorf("bytes_dropped %d, want %d: %d bytes of output, %d of them shown", c.Unseen, want, b.output, shown)
	}
}

func TestACutSaysExactlyHowMuchOutputTheModelDidNotSee(t *testing.T) {
	rnd := rand.New(rand.NewPCG(23, 1))
	words := []string{"a", "line\n", "é", "日本語", "🙂", "x y z ", "0123456789"}
	for i := range 2000 {
		var b toolText
		for range rnd.IntN(40) {
			switch rnd.IntN(6) {
			case 0:
				dropped := rnd.Int64N(1 << 20)
				b.note(fmt.Sprintf("\n[... %d bytes dropped ...]\n", dropped), dropped)
			case 1:
				b.note([]string{"[stderr]\n", "[exit code 3]\n", "\n", "[killed: out of memory]\n"}[rnd.IntN(4)], 0)
			default:
				b.out(strings.Repeat(words[rnd.IntN(len(words))], 1+rnd.IntN(200)))
			}
		}
		limit := 80 + rnd.IntN(2000)
		t.Run(fmt.Sprintf("case %d of %d bytes cut to %d", i, len(b.text), limit), func(t *testing.T) {
			b.check(t, agent.CutText(b.text, b.notes, limit), limit)
		})
		if t.Failed() {
			break
		}
	}
}

func TestACutOfPlainTextCountsTheMarkerOnNeitherSide(t *testing.T) {
	// The case: 37191 bytes told, 37240 recorded.
	text := strings.Repeat("0123456789abcdef", 3328) // 53,248 bytes
	c := agent.CutText(text, nil, 16384)
	shown := strings.Replace(c.Text, fmt.Sprintf("\n[... output truncated: %d bytes omitted ...]\n", c.Omitted), "", 1)
	if want := int64(len(text) - len(shown)); c.Omitted != want || c.Unseen != want || len(c.Text) > 16384 {
		t.Errorf("told %d, bytes_dropped %d, %d bytes not shown (%d shown of 16384)", c.Omitted, c.Unseen, want, len(c.Text))
	}
}

func TestInvalidBytesAreShownAsOneReplacementAndCountAsSeen(t *testing.T) {
	text := "ok\xff\xfe" + strings.Repeat("x", 300) + "\xc3"
	c := agent.CutText(text, nil, 120)
	if !utf8.ValidString(c.Text) || !strings.HasPrefix(c.Text, "ok\uFFFD") || !strings.HasSuffix(c.Text, "x\uFFFD") || len(c.Text) > 120 {
		t.Fatalf("cut %q", c.Text)
	}
	// Shown: "ok", the 2 invalid bytes, the x's of head and tail, the last byte.
	xs := strings.Count(c.Text, "x")
	if want := int64(len(text) - (2 + 2 + xs + 1)); c.Omitted != want || c.Unseen != want {
		t.Errorf("omitted %d, unseen %d, want %d", c.Omitted, c.Unseen, want)
	}
	if c := agent.CutText("caf\xe9", nil, 100); c.Text != "caf\uFFFD" || c.Truncated || c.Unseen != 0 {
		t.Errorf("short invalid text: %+v", c)
	}
}

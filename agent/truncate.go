package agent

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rollbox/rollbox/tools"
)

// Cut is a tool's text as cut for the model.
type Cut struct {
	// Text is what the model sees: valid UTF-8 of at most the limit
	// (unless the limit is shorter than the marker itself).
	Text string
	// Truncated says the middle of the text was cut out for a marker.
	Truncated bool
	// Omitted is the number the truncation marker states: the bytes of
	// output between the head and the tail that are shown, including what
	// the caps' markers cut with them stood for. 0 when nothing was cut.
	Omitted int64
	// Unseen is every byte of output the model did not see: Omitted plus
	// what the caps' markers it does see stand for. The numbers in the
	// markers the model sees add up to it. It is the step's bytes_dropped.
	Unseen int64
}

// truncationMarker is what replaces the middle of a text cut for the model.
func truncationMarker(omitted int64) string {
	return fmt.Sprintf("\n[... output truncated: %d bytes omitted ...]\n", omitted)
}

// Truncate cuts text (all of it output) to limit bytes for the model: the
// head and the tail with a marker between them saying how many bytes were
// left out, which is the number returned. It cuts on rune boundaries and
// makes the text valid UTF-8 (a run of invalid bytes is shown as one
// U+FFFD and counts as shown).
func Truncate(text string, limit int) (string, int64) {
	c := CutText(text, nil, limit)
	return c.Text, c.Omitted
}

// CutText cuts a tool's text to limit bytes for the model, as Truncate
// does, counting only output (not the tool's notes) as omitted or unseen.
// A note is kept whole or cut whole. Notes that are out of order, overlap
// or fall outside text count as output.
func CutText(text string, notes []tools.Note, limit int) Cut {
	segs := segments(text, notes)
	var rendered int
	var output int64
	for _, s := range segs {
		rendered += len(s.text)
		output += s.stands
	}
	if limit <= 0 || rendered <= limit {
		var b strings.Builder
		var unseen int64
		for _, s := range segs {
			b.WriteString(s.text)
			if s.note {
				unseen += s.stands
			}
		}
		return Cut{Text: b.String(), Unseen: unseen}
	}
	// The marker's number is at most all of the output: room for that many
	// digits keeps the text within the limit whatever the number is.
	budget := max(limit-len(truncationMarker(0))+1-len(strconv.FormatInt(output, 10)), 0)
	headRoom, tailRoom := budget-budget/2, budget/2

	var head, tail []segmentPart
	hi, taken := 0, 0 // segments before hi are in the head, and taken bytes of segs[hi]
	for room := headRoom; hi < len(segs); hi++ {
		s := segs[hi]
		if len(s.text) <= room {
			head = append(head, segmentPart{s, s.text})
			room -= len(s.text)
			continue
		}
		if s.splittable {
			taken = room
			for taken > 0 && !utf8.RuneStart(s.text[taken]) {
				taken--
			}
			if taken > 0 {
				head = append(head, segmentPart{s, s.text[:taken]})
			}
		}
		break
	}
	for room, ti := tailRoom, len(segs)-1; ti >= hi; ti-- {
		s := segs[ti]
		avail := len(s.text)
		if ti == hi {
			avail -= taken
		}
		if avail == len(s.text) && avail <= room {
			tail = append(tail, segmentPart{s, s.text})
			room -= avail
			continue
		}
		if s.splittable {
			t := len(s.text) - min(room, avail)
			for t < len(s.text) && !utf8.RuneStart(s.text[t]) {
				t++
			}
			if t < len(s.text) {
				tail = append(tail, segmentPart{s, s.text[t:]})
			}
		}
		break
	}
	var b strings.Builder
	var shown, notesShown int64
	for _, p := range head {
		b.WriteString(p.text)
		shown += p.stands()
		if p.seg.note {
			notesShown += p.seg.stands
		}
	}
	omitted := output
	for _, p := range tail {
		shown += p.stands()
		if p.seg.note {
			notesShown += p.seg.stands
		}
	}
	omitted -= shown
	b.WriteString(truncationMarker(omitted))
	for i := len(tail) - 1; i >= 0; i-- {
		b.WriteString(tail[i].text)
	}
	return Cut{Text: b.String(), Truncated: true, Omitted: omitted, Unseen: omitted + notesShown}
}

// segment is a piece of a tool's text as the model would see it.
type segment struct {
	start int    // offset in the tool's text
	text  string // as shown: valid UTF-8
	// stands is how many bytes of output it stands for: its length for
	// valid output, the run's length for invalid bytes (shown as one
	// U+FFFD), a note's Stands.
	stands     int64
	note       bool
	splittable bool // valid output: may be cut at any rune boundary
}

// segmentPart is a segment or the part of one (a splittable one's prefix
// or suffix) that is shown.
type segmentPart struct {
	seg  segment
	text string
}

func (p segmentPart) stands() int64 {
	if p.seg.splittable {
		return int64(len(p.text))
	}
	return p.seg.stands
}

// segments splits text into output (valid runs, splittable; invalid runs,
// whole) and notes (whole).
func segments(text string, notes []tools.Note) []segment {
	var segs []segment
	at := 0
	for _, n := range notes {
		if n.Start < at || n.End < n.Start || n.End > len(text) || n.Stands < 0 {
			continue
		}
		segs = appendOutput(segs, text, at, n.Start)
		segs = append(segs, segment{start: n.Start, text: strings.ToValidUTF8(text[n.Start:n.End], "\uFFFD"), stands: n.Stands, note: true})
		at = n.End
	}
	return appendOutput(segs, text, at, len(text))
}

func appendOutput(segs []segment, text string, from, to int) []segment {
	for i := from; i < to; {
		j := i
		for j < to {
			r, size := utf8.DecodeRuneInString(text[j:to])
			if r == utf8.RuneError && size == 1 {
				break
			}
			j += size
		}
		if j > i {
			segs = append(segs, segment{start: i, text: text[i:j], stands: int64(j - i), splittable: true})
		}
		k := j
		for k < to {
			r, size := utf8.DecodeRuneInString(text[k:to])
			if r != utf8.RuneError || size != 1 {
				break
			}
			k++
		}
		if k > j {
			segs = append(segs, segment{start: j, text: "\uFFFD", stands: int64(k - j)})
		}
		i = k
	}
	return segs
}

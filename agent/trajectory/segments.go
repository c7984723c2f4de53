package trajectory

import "fmt"

// BuildSegments rebuilds the token sequences of a token-mode episode from
// its model steps: a step with PromptIDs starts a segment (its ids are the
// prompt, mask 0), a step with PromptDeltaIDs extends the current one (the
// delta, mask 0); each step's CompletionIDs follow with mask 1. Steps
// without a Segment (chat mode) are skipped; nil when there are none.
//
// # Errors
//
// A step that continues a segment other than the current one, or that
// starts none when no segment is open, is an inconsistent record.
func BuildSegments(steps []Step) ([]Segment, error) {
	var out []Segment
	for _, s := range steps {
		if s.Type != StepModel || s.Segment == nil {
			continue
		}
		switch {
		case *s.Segment == len(out):
			reason := s.SegmentReason
			if reason == "" {
				reason = SegmentStart
			}
			out = append(out, Segment{StartTurn: s.Turn, EndTurn: s.Turn, Reason: reason,
				Ids: append([]int64(nil), s.PromptIDs...), LossMask: make([]int8, len(s.PromptIDs))})
		case *s.Segment != len(out)-1 || s.PromptIDs != nil:
			return nil, fmt.Errorf("trajectory: step %d is in segment %d (prompt_ids set: %t), but segment %d is the current one", s.Index, *s.Segment, s.PromptIDs != nil, len(out)-1)
		default:
			seg := &out[len(out)-1]
			seg.Ids = append(seg.Ids, s.PromptDeltaIDs...)
			seg.LossMask = append(seg.LossMask, make([]int8, len(s.PromptDeltaIDs))...)
		}
		seg := &out[len(out)-1]
		seg.EndTurn = s.Turn
		seg.Ids = append(seg.Ids, s.CompletionIDs...)
		for range s.CompletionIDs {
			seg.LossMask = append(seg.LossMask, 1)
		}
	}
	return out, nil
}

// TurnPrompts returns each token-mode model step's full prompt, by step
// index: the segment's ids up to the turn's completion.
func TurnPrompts(steps []Step) map[int][]int64 {
	out := map[int][]int64{}
	var cur []int64
	for _, s := range steps {
		if s.Type != StepModel || s.Segment == nil {
			continue
		}
		if s.PromptIDs != nil {
			cur = append([]int64(nil), s.PromptIDs...)
		} else {
			cur = append(cur, s.PromptDeltaIDs...)
		}
		out[s.Index] = append([]int64(nil), cur...)
		cur = append(cur, s.CompletionIDs...)
	}
	return out
}

package agent

import (
	"encoding/json"
	"fmt"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// tokenStepLocked fills a token-mode model step from the turn's ids: the
// segment it belongs to (the current one when its prompt extends the
// segment's ids, a new one otherwise), its prompt (whole, or the delta),
// completion ids and logprobs, and advances the episode's token state. It
// returns what is wrong with the server's ids, if anything: the turn is
// then recorded and the episode ends policy_error.
func (s *Session) tokenStepLocked(step *trajectory.Step, turn Turn) string {
	step.Tokens = trajectory.TokensExact
	tt := turn.Tokens
	if tt == nil {
		tt = &TurnTokens{}
	}
	st := &s.tok
	if st.restart == "" && hasPrefix(tt.Prompt, st.ids) {
		step.PromptDeltaIDs = append([]int64{}, tt.Prompt[len(st.ids):]...)
	} else {
		reason := st.restart
		if reason == "" {
			// The policy could not extend the sequence (the template renders
			// the new messages differently after the history): recorded.
			reason = tt.SegmentReason
			if reason == "" {
				reason = trajectory.SegmentTemplate
			}
		}
		st.segment++
		st.restart = ""
		step.SegmentReason = reason
		step.PromptIDs = append([]int64{}, tt.Prompt...)
	}
	seg := st.segment
	step.Segment = &seg
	step.CompletionIDs = append([]int64{}, tt.Completion...)
	if tt.Logprobs != nil {
		step.Logprobs, _ = json.Marshal(tt.Logprobs)
	} else {
		step.LogprobsAbsent = true
	}
	st.ids = append(append(make([]int64, 0, len(tt.Prompt)+len(tt.Completion)), tt.Prompt...), tt.Completion...)

	msg := tokensMismatch(turn, tt)
	step.TokensError = msg
	return msg
}

// tokensMismatch says how the server's account of a turn disagrees with
// the ids it was sent and sampled ("" when it agrees).
func tokensMismatch(turn Turn, tt *TurnTokens) string {
	switch {
	case len(tt.Prompt) == 0:
		return "the policy sent no prompt ids"
	case len(tt.Completion) == 0:
		return "the server returned no completion token ids (token mode needs return_token_ids or return_tokens_as_token_ids)"
	case tt.EchoedPrompt != nil && !equalIDs(tt.EchoedPrompt, tt.Prompt):
		return fmt.Sprintf("the server reports a prompt of %d ids that is not the %d ids it was sent (first difference at position %d)",
			len(tt.EchoedPrompt), len(tt.Prompt), firstDiff(tt.EchoedPrompt, tt.Prompt))
	case tt.LogprobIDs != nil && !equalIDs(tt.LogprobIDs, tt.Completion):
		return fmt.Sprintf("the server's logprobs name %d tokens that are not its %d completion ids (first difference at position %d)",
			len(tt.LogprobIDs), len(tt.Completion), firstDiff(tt.LogprobIDs, tt.Completion))
	case tt.Logprobs != nil && len(tt.Logprobs) != len(tt.Completion):
		return fmt.Sprintf("the server sent %d logprobs for %d completion ids", len(tt.Logprobs), len(tt.Completion))
	case turn.Usage != nil && turn.Usage.PromptTokens != int64(len(tt.Prompt)):
		return fmt.Sprintf("the server reports prompt_tokens %d for a prompt of %d ids", turn.Usage.PromptTokens, len(tt.Prompt))
	case turn.Usage != nil && turn.Usage.CompletionTokens != int64(len(tt.Completion)):
		return fmt.Sprintf("the server reports completion_tokens %d for %d completion ids", turn.Usage.CompletionTokens, len(tt.Completion))
	}
	return ""
}

// restartSegmentLocked makes the next token-mode turn start a new segment:
// the history the model sees was rewritten (pruning, truncation).
func (s *Session) restartSegmentLocked(reason string) {
	if s.tok.on && s.tok.restart == "" {
		s.tok.restart = reason
	}
}

func segmentWhy(reason string) string {
	switch reason {
	case trajectory.SegmentPruned:
		return "pruning rewrote earlier tool results, so the conversation was rendered again"
	case trajectory.SegmentTruncated:
		return "tool outputs were removed to fit max_context_tokens, so the conversation was rendered again"
	}
	return "the server's rendering of the new messages did not extend the previous prompt and completion, so the conversation was rendered again"
}

func hasPrefix(ids, prefix []int64) bool {
	return len(ids) >= len(prefix) && equalIDs(ids[:len(prefix)], prefix)
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

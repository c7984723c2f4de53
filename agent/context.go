package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/retriever"
	"github.com/rollbox/rollbox/tools"
)

// applyPruneLocked replaces the text of each pruned document in earlier
// messages with a short placeholder, so the policy no longer sees it. It
// reports whether any message changed.
func (s *Session) applyPruneLocked(ids []string) (changed bool) {
	for i := range s.messages {
		m := &s.messages[i]
		if m.Role != RoleTool {
			continue
		}
		for _, id := range ids {
			open, close := tools.DocOpen(id), tools.DocClose(id)
			for {
				a := strings.Index(m.Content, open)
				if a < 0 {
					break
				}
				b := strings.Index(m.Content[a:], close)
				if b < 0 {
					break
				}
				b += a + len(close)
				m.Content = m.Content[:a] + tools.Pruned(id) + m.Content[b:]
				changed = true
			}
		}
	}
	return changed
}

// EstimateTokens is Rollbox's token estimate when the server reports no
// usage: one token per 4 bytes of UTF-8, rounded up. It overestimates
// English prose slightly for BPE tokenizers and underestimates dense code.
// It is the retriever's own, so the context ledger and the episode's
// budget count alike.
func EstimateTokens(s string) int64 { return retriever.EstimateTokens(s) }

// messageTokens estimates a message: its text plus 4 tokens of framing.
func messageTokens(m Message) int64 {
	n := EstimateTokens(m.Content) + 4
	for _, c := range m.ToolCalls {
		n += EstimateTokens(c.Name) + EstimateTokens(c.Arguments) + 4
	}
	return n
}

// contextTokensLocked is the size of the next prompt: the server's last
// report plus estimates of what came after, or all estimates.
func (s *Session) contextTokensLocked() int64 {
	var n int64
	from := 0
	if s.lastUsage > 0 && s.lastUsageMsgs <= len(s.messages) {
		n, from = s.lastUsage, s.lastUsageMsgs
	} else {
		for _, sc := range s.schemas {
			n += EstimateTokens(sc.Name) + EstimateTokens(sc.Description) + EstimateTokens(string(sc.Parameters))
		}
	}
	for _, m := range s.messages[from:] {
		n += messageTokens(m)
	}
	return n
}

// fitContextLocked enforces max_context_tokens: "end" returns an error;
// "truncate" blanks the oldest tool outputs until the context fits. A
// context event that cannot be recorded ends the episode (*RecordError).
func (s *Session) fitContextLocked(ctx context.Context) error {
	limit := int64(s.task.Limits.MaxContextTokens)
	n := s.contextTokensLocked()
	s.stats.ContextTokens = n
	if limit <= 0 || n <= limit {
		return nil
	}
	last := s.w.Steps() - 1
	if s.task.Limits.ContextOverflow == "truncate" {
		s.lastUsage = 0 // the server's count no longer applies
		for i := range s.messages {
			m := &s.messages[i]
			if m.Role != RoleTool || strings.HasPrefix(m.Content, "[removed") {
				continue
			}
			before := messageTokens(*m)
			m.Content = "[removed to fit the context budget]"
			s.restartSegmentLocked(trajectory.SegmentTruncated)
			if err := s.event(trajectory.ContextEvent{Step: last, Kind: "context_truncated",
				Detail: fmt.Sprintf("tool output of message %d removed to fit max_context_tokens %d", i, limit), Tokens: before - messageTokens(*m)}); err != nil {
				return s.failRecord(err)
			}
			if n = s.contextTokensLocked(); n <= limit {
				s.stats.ContextTokens = n
				return nil
			}
		}
	}
	if err := s.event(trajectory.ContextEvent{Step: last, Kind: "context_overflow",
		Detail: fmt.Sprintf("context of %d tokens exceeds max_context_tokens %d", n, limit), Tokens: n}); err != nil {
		return s.failRecord(err)
	}
	return fmt.Errorf("context of %d tokens exceeds max_context_tokens %d", n, limit)
}

package retriever

import (
	"fmt"
	"sync"
)

// EstimateTokens is Rollbox's token estimate, one token per 4 bytes,
// rounded up; agent.EstimateTokens calls it, so that the ledger and the
// episode's context budget count alike.
func EstimateTokens(s string) int64 { return int64((len(s) + 3) / 4) }

// Ledger is one episode's account of the documents in the model's context
// and the tokens each holds, under a budget. It is safe for concurrent use.
type Ledger struct {
	budget int64

	mu    sync.Mutex
	used  int64
	held  map[string]int64
	order []string
}

// Entry is one document held in context.
type Entry struct {
	ID     string
	Tokens int64
}

// BudgetError is an ErrOverBudget: adding ID's Tokens to Used would pass
// Budget.
type BudgetError struct {
	ID                   string
	Tokens, Used, Budget int64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("document %s needs %d tokens but only %d of the %d-token document budget are free", e.ID, e.Tokens, e.Budget-e.Used, e.Budget)
}

func (e *BudgetError) Unwrap() error { return ErrOverBudget }

// NewLedger makes an empty ledger with a token budget (<= 0: unlimited).
func NewLedger(budget int64) *Ledger {
	return &Ledger{budget: budget, held: map[string]int64{}}
}

// Budget returns the token budget (<= 0: unlimited).
func (l *Ledger) Budget() int64 { return l.budget }

// Used returns the tokens held.
func (l *Ledger) Used() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// Has reports whether id is held, and its tokens.
func (l *Ledger) Has(id string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.held[id]
	return n, ok
}

// Add records id as held with its tokens. Adding an id already held
// changes nothing.
//
// # Errors
//
// A *BudgetError (ErrOverBudget) when the budget cannot take it; nothing
// is recorded then.
func (l *Ledger) Add(id string, tokens int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.held[id]; ok {
		return nil
	}
	if l.budget > 0 && l.used+tokens > l.budget {
		return &BudgetError{ID: id, Tokens: tokens, Used: l.used, Budget: l.budget}
	}
	l.held[id] = tokens
	l.order = append(l.order, id)
	l.used += tokens
	return nil
}

// Remove drops the ids that are held and returns those it dropped, in the
// order given, and the tokens freed. Ids not held are ignored.
func (l *Ledger) Remove(ids ...string) (removed []string, freed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		n, ok := l.held[id]
		if !ok {
			continue
		}
		delete(l.held, id)
		l.used -= n
		freed += n
		removed = append(removed, id)
	}
	if len(removed) > 0 {
		kept := l.order[:0]
		for _, id := range l.order {
			if _, ok := l.held[id]; ok {
				kept = append(kept, id)
			}
		}
		l.order = kept
	}
	return removed, freed
}

// Entries lists the documents held, oldest first.
func (l *Ledger) Entries() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Entry, len(l.order))
	for i, id := range l.order {
		out[i] = Entry{id, l.held[id]}
	}
	return out
}

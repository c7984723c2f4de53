package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rollbox/rollbox/retriever"
)

// Retriever is what the search tools need of an index; *retriever.Index
// is one, shared read-only by every episode.
type Retriever interface {
	Search(ctx context.Context, q retriever.Query) (retriever.Results, error)
	Document(ctx context.Context, id string) (retriever.Doc, error)
	Chunks(ctx context.Context, parent string) ([]string, error)
}

// LedgerKey is the Env.Extra key of the episode's *retriever.Ledger.
const LedgerKey = "retriever.ledger"

// Context event kinds the search tools report (Result.Events). "seen" and
// "pruned" are what the agent loop acts on: seen ids feed the trajectory
// recall reward, pruned ids have their text replaced in earlier messages.
const (
	EventSeen        = "seen"
	EventRead        = "read"
	EventReadRefused = "read_refused"
	EventPruned      = "pruned"
)

// MaxSearchK bounds the k a model may ask search for.
const MaxSearchK = 50

// SearchNames are the retrieval tools (SearchTools), in their usual order.
func SearchNames() []string { return []string{NameSearch, NameRead, NamePrune} }

// SearchOptions tune the retrieval tools.
type SearchOptions struct {
	// MaxDocBytes caps what read shows of one document, markers included,
	// so that the whole of it (and both markers) reaches the model; set it
	// to the episode's max_tool_output_bytes. 0: no cap.
	MaxDocBytes int
}

// SearchTools returns the search, read and prune tools over ix, by name,
// for Config.ExtraTools. Each episode needs its own ledger in its Env
// (WithLedger).
func SearchTools(ix Retriever, opts SearchOptions) map[string]Tool {
	return map[string]Tool{
		"search": Search{Index: ix},
		"read":   Read{Index: ix, MaxDocBytes: opts.MaxDocBytes},
		"prune":  Prune{},
	}
}

// WithLedger gives an episode's tool environment its context ledger.
func WithLedger(env *Env, l *retriever.Ledger) {
	if env.Extra == nil {
		env.Extra = map[string]any{}
	}
	env.Extra[LedgerKey] = l
}

// LedgerOf returns the episode's ledger, or nil.
func LedgerOf(env *Env) *retriever.Ledger {
	l, _ := env.Extra[LedgerKey].(*retriever.Ledger)
	return l
}

var errNoLedger = errors.New("search tools: the episode's tool environment has no context ledger (tools.WithLedger was not called)")

// Document markers. DocOpen and DocClose bracket a document's text in a
// read result ("<<doc ID>>\n...\n<</doc ID>>"); the agent loop finds them to
// replace a pruned document with Pruned(ID), which starts with PruneMarker.
const (
	docOpenPrefix  = "<<doc "
	docClosePrefix = "<</doc "
	PruneMarker    = "[pruned from context: "
)

func DocOpen(id string) string  { return docOpenPrefix + id + ">>" }
func DocClose(id string) string { return docClosePrefix + id + ">>" }
func Pruned(id string) string   { return PruneMarker + id + "]" }

// Search ranks documents for a query.
type Search struct{ Index Retriever }

func (Search) Schema() Schema {
	return schema(NameSearch, "Search the document collection. Returns the best matching documents, best first: id, title and a snippet; documents already in your context are marked. Read a document by its id to see all of it.", object(map[string]*param{
		"query":   str("words to search for"),
		"k":       integer(fmt.Sprintf("how many results to return (default %d)", retriever.DefaultK), 1, MaxSearchK),
		"filters": {Type: "object", Description: "optional exact-match filters on metadata fields: {\"field\": \"value\"}"},
	}, "query"))
}

func (s Search) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	led := LedgerOf(env)
	if led == nil {
		return Result{}, errNoLedger
	}
	q := retriever.Query{Text: strings.TrimSpace(args["query"].(string))}
	if q.Text == "" {
		return failf(KindBadArguments, "search: the query is empty; give words to search for"), nil
	}
	if k, ok := args["k"].(float64); ok {
		q.K = int(k)
	}
	if f, ok := args["filters"].(map[string]any); ok && len(f) > 0 {
		q.Filters = map[string]string{}
		for name, v := range f {
			sv, ok := v.(string)
			if !ok {
				return failf(KindBadArguments, "search: filters.%s must be a string, got %s", name, jsonType(v)), nil
			}
			q.Filters[name] = sv
		}
	}
	res, err := s.Index.Search(ctx, q)
	if errors.Is(err, retriever.ErrInvalidQuery) {
		return failf(KindBadArguments, "search: %v", err), nil
	}
	if err != nil {
		return Result{}, err
	}
	var b strings.Builder
	if len(res.Hits) == 0 {
		fmt.Fprintf(&b, "no documents match %q\n", q.Text)
		return Result{Text: b.String()}, nil
	}
	fmt.Fprintf(&b, "%d of %d matching documents for %q, best first:\n", len(res.Hits), res.Total, q.Text)
	seen := make([]string, 0, len(res.Hits))
	for i, h := range res.Hits {
		seen = append(seen, h.ID)
		fmt.Fprintf(&b, "%d. id: %s", i+1, h.ID)
		if h.Title != "" {
			fmt.Fprintf(&b, " | title: %s", defang(oneLine(h.Title)))
		}
		if h.Chunks > 0 {
			fmt.Fprintf(&b, " | part %d of %d of %s", h.Chunk, h.Chunks, h.Parent)
		}
		if _, in := led.Has(h.ID); in {
			b.WriteString(" [in context]")
		}
		b.WriteByte('\n')
		if h.Snippet != "" {
			fmt.Fprintf(&b, "   %s\n", defang(h.Snippet))
		}
	}
	return Result{Text: b.String(), Events: []Event{{Kind: EventSeen, IDs: seen,
		Detail: fmt.Sprintf("search %q: %d of %d", q.Text, len(res.Hits), res.Total)}}}, nil
}

// Read puts one document's text in the model's context.
type Read struct {
	Index       Retriever
	MaxDocBytes int
}

func (Read) Schema() Schema {
	return schema(NameRead, "Read one document by its id (from search results). Its text stays in your context, counted against your document budget, until you prune it.", object(map[string]*param{
		"id": str("the document's id"),
	}, "id"))
}

func (r Read) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	led := LedgerOf(env)
	if led == nil {
		return Result{}, errNoLedger
	}
	id := strings.TrimSpace(args["id"].(string))
	if n, in := led.Has(id); in {
		return Result{Text: fmt.Sprintf("document %s is already in your context (%d tokens), in an earlier message; prune it first to read it again\n", id, n)}, nil
	}
	d, err := r.Index.Document(ctx, id)
	if errors.Is(err, retriever.ErrNotFound) {
		chunks, cerr := r.Index.Chunks(ctx, id)
		if cerr != nil {
			return Result{}, cerr
		}
		if len(chunks) > 0 {
			return failf(KindBadArguments, "read: %s was split into %d parts; read one of them by id: %s", id, len(chunks), listIDs(chunks, 12)), nil
		}
		return failf(KindBadArguments, "read: unknown id %q; use an id from the search results", id), nil
	}
	if err != nil {
		return Result{}, err
	}
	text := formatDoc(d, r.MaxDocBytes)
	tokens := retriever.EstimateTokens(text)
	if err := led.Add(id, tokens); err != nil {
		var be *retriever.BudgetError
		if !errors.As(err, &be) {
			return Result{}, err
		}
		res := failf(KindBadArguments, "read refused: %v. Prune documents you no longer need first (prune {\"ids\": [...]}); in your context now: %s", be, heldList(led))
		res.Events = []Event{{Kind: EventReadRefused, IDs: []string{id}, Tokens: tokens,
			Detail: fmt.Sprintf("needs %d tokens, %d of %d in use", tokens, be.Used, be.Budget)}}
		return res, nil
	}
	return Result{Text: text, Events: []Event{
		{Kind: EventSeen, IDs: []string{id}},
		{Kind: EventRead, IDs: []string{id}, Tokens: tokens, Detail: budgetLine(led)},
	}}, nil
}

// formatDoc wraps a document in its markers, cutting its text so that the
// whole fits maxBytes (0: no cap).
func formatDoc(d retriever.Doc, maxBytes int) string {
	var head strings.Builder
	head.WriteString(DocOpen(d.ID) + "\n")
	if d.Title != "" {
		fmt.Fprintf(&head, "title: %s\n", defang(oneLine(d.Title)))
	}
	if d.Chunks > 0 {
		fmt.Fprintf(&head, "part %d of %d of %s\n", d.Chunk, d.Chunks, d.Parent)
	}
	head.WriteString("\n")
	body := defang(strings.TrimRight(d.Text, "\n")) + "\n"
	tail := DocClose(d.ID) + "\n"
	if maxBytes > 0 && head.Len()+len(body)+len(tail) > maxBytes {
		note := fmt.Sprintf("\n[... the rest of this document (%d bytes) does not fit one tool output and is not shown ...]\n", len(body))
		keep := maxBytes - head.Len() - len(tail) - len(note)
		if keep < 0 {
			keep = 0
		}
		cut := strings.ToValidUTF8(body[:min(keep, len(body))], "")
		note = fmt.Sprintf("\n[... the rest of this document (%d bytes) does not fit one tool output and is not shown ...]\n", len(body)-len(cut))
		body = cut + note
	}
	return head.String() + body + tail
}

// Prune removes documents from the model's context.
type Prune struct{}

func (Prune) Schema() Schema {
	one := 1
	return schema(NamePrune, "Remove documents from your context to free budget for others: their text in earlier messages is replaced by a short placeholder. Prune several at once when you can.", object(map[string]*param{
		"ids": {Type: "array", Description: "ids of the documents to remove (a document's id also removes its parts held)", Items: &param{Type: "string", MinLength: &one}, MinItems: &one},
	}, "ids"))
}

func (Prune) Run(ctx context.Context, env *Env, args map[string]any) (Result, error) {
	led := LedgerOf(env)
	if led == nil {
		return Result{}, errNoLedger
	}
	var want []string
	dup := map[string]bool{}
	add := func(id string) {
		if !dup[id] {
			dup[id] = true
			want = append(want, id)
		}
	}
	var missing []string
	held := led.Entries()
	for _, v := range args["ids"].([]any) {
		id := strings.TrimSpace(v.(string))
		if _, in := led.Has(id); in {
			add(id)
			continue
		}
		parts := 0
		for _, e := range held { // a parent's id prunes the parts of it held
			if strings.HasPrefix(e.ID, id+"#") {
				add(e.ID)
				parts++
			}
		}
		if parts == 0 && !dup[id] {
			missing = append(missing, id)
		}
	}
	if len(want) == 0 {
		return failf(KindBadArguments, "prune: none of %s is in your context; in your context now: %s", strings.Join(missing, ", "), heldList(led)), nil
	}
	removed, freed := led.Remove(want...)
	var b strings.Builder
	fmt.Fprintf(&b, "pruned %s (freed %d tokens); %s\n", strings.Join(removed, ", "), freed, budgetLine(led))
	if len(missing) > 0 {
		fmt.Fprintf(&b, "not in your context: %s\n", strings.Join(missing, ", "))
	}
	return Result{Text: b.String(), Events: []Event{{Kind: EventPruned, IDs: removed, Tokens: freed, Detail: budgetLine(led)}}}, nil
}

func budgetLine(l *retriever.Ledger) string {
	if l.Budget() <= 0 {
		return fmt.Sprintf("%d document tokens in context", l.Used())
	}
	return fmt.Sprintf("%d of %d document tokens in use", l.Used(), l.Budget())
}

func heldList(l *retriever.Ledger) string {
	es := l.Entries()
	if len(es) == 0 {
		return "nothing"
	}
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s (%d tokens)", e.ID, e.Tokens)
	}
	return strings.Join(parts, ", ")
}

func listIDs(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:n], ", ") + fmt.Sprintf(", … (%d more)", len(ids)-n)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// defang breaks document markers inside a document's own text, so that a
// corpus cannot make pruning cut the wrong span.
func defang(s string) string {
	if !strings.Contains(s, "<<") {
		return s
	}
	return strings.NewReplacer(docOpenPrefix, "<< doc ", docClosePrefix, "<</ doc ").Replace(s)
}

package retriever

import "errors"

// Error kinds. Functions wrap one of these with %w and what it concerns
// (the corpus line, the index directory, the id).
var (
	// ErrBadCorpus: a corpus line is not a valid document (not JSON, no id,
	// a duplicate id, ...). The message names the line.
	ErrBadCorpus = errors.New("bad corpus")
	// ErrExists: a build's output directory already holds something.
	ErrExists = errors.New("already exists")
	// ErrNotIndex: a directory is not a complete Rollbox index (missing,
	// another kind of directory, or a build that did not finish).
	ErrNotIndex = errors.New("not a rollbox index")
	// ErrLocked: the index's store is locked by a writer and did not come
	// free within the lock timeout.
	ErrLocked = errors.New("index locked")
	// ErrInvalidQuery: an empty query, k out of range, a bad filter.
	ErrInvalidQuery = errors.New("invalid query")
	// ErrNotFound: no document (or chunk) has that id.
	ErrNotFound = errors.New("no such document")
	// ErrOverBudget: adding a document would exceed the context budget.
	ErrOverBudget = errors.New("over the context budget")
	// ErrClosed: the index was closed.
	ErrClosed = errors.New("index closed")
)

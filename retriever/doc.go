// Package retriever is the search side of Rollbox's retrieval episodes: it
// builds a bleve index from a JSONL corpus (optionally split into chunks
// with stable ids), opens it read-only so that one *Index serves every
// concurrent episode, ranks with BM25 over a title field boosted above the
// text, filters on exact metadata values, and keeps each episode's context
// Ledger: which documents the model holds in its context and how many
// tokens each costs, under a budget that pruning frees.
//
// The package knows nothing about agents or tools: the search, read and
// prune tools live in package tools and use an *Index and a *Ledger.
//
// # Notes
//
// Ranking is bleve's BM25 scoring model (the index mapping's
// scoring_model "bm25", bleve 2.5+), not tf-idf. Indexes are built
// offline by bleve's single-segment builder and never written afterwards;
// a build writes a rollbox-index.json record last, and Open refuses a
// directory without one, so a reader never sees a half-built index.
package retriever

// Package reward computes outcome rewards: tests (a verifier command in the
// sandbox after the episode, with the task's test files restored first and
// files that could rig a test runner removed), exact and regex (the answer
// given to finish), fbeta (retrieval ids), judge (a generative reward model)
// and composite (a weighted sum). Every component is recorded.
//
// A reward is never computed from a sandbox that failed: Evaluate returns
// an error instead, and the episode ends sandbox_error with no score.
package reward

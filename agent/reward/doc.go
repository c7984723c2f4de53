// Package reward computes outcome rewards: tests (a verifier command run in
// a clean room after the episode), exact and regex (the answer given to
// finish), fbeta (retrieval ids), judge (a generative reward model) and
// composite (a weighted sum). Every component is recorded.
//
// # Tests rewards
//
// The verifier never runs where the agent was. It reads the agent's
// workspace out of the episode's sandbox through the file API (collect.go:
// breadth-first, bounded in entries, files, bytes and depth, eight reads at
// a time; symlinks, devices and FIFOs are recorded and never followed),
// closes that sandbox, and makes a fresh one of the same backend and spec.
// Into it go the task's files, then the agent's changes the reward takes
// (selection in cleanroom.go: every path outside the protected tests and
// the runner's configuration by default, or only reward.editable), then
// reward.hidden_tests. The command runs there with the sandbox's own
// environment (the task's sandbox.env and the pins) and the runner's
// isolation (pytest: PYTHONSAFEPATH, --import-mode=append, -c the task's
// configuration, no cache). The score comes from the runner's report of
// named tests (package testreport) when the reward names one, else from
// the exit status.
//
// # Errors
//
// Evaluate returns an error only when the reward cannot be computed for a
// reason that is not the agent's answer. One wrapping
// sandbox.ErrSandboxAbuse means the episode's commands broke a sandbox (its
// own before its files were read while a fresh one starts, or the
// verifier's, twice with the agent's files and not without them): the
// episode is scored 0. Any other means the infrastructure failed (a fresh
// sandbox did not start twice): the episode ends sandbox_error, unscored.
// What the agent left that cannot be verified (too large, does not fit, no
// report) is a reward of 0 with Verifier.Blame saying why, not an error.
package reward

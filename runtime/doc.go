// Package runtime schedules episodes: batches of tasks × GRPO groups run
// with bounded concurrency (rollbox run), the rollout HTTP API (rollbox
// serve), the trajectory store and summaries, group statistics and metrics.
package runtime

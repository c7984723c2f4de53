// Package runtime schedules episodes: batches of tasks × GRPO groups run
// with bounded concurrency (rollbox run, RunBatch), and the rollout service
// (rollbox serve, Server): the HTTP API in rollout mode (a batch against the
// trainer's policy endpoint, streamed back as NDJSON with group statistics)
// and environment mode (reset/step/finish for trainers that own the loop),
// a round-robin scheduler with admission control, per-backend and
// per-endpoint bounds and warm pools sized from demand, a store under the
// data directory that survives a crash (a bbolt index over the journalled
// trajectories), JSONL/Parquet export, summaries and Prometheus metrics.
package runtime

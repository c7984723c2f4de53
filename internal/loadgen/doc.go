// Package loadgen is the load generator behind `rollbox bench`: it runs
// `rollbox serve` in a child process (Service), submits a rollout against a
// fake policy and measures it as it streams back (Rollout), or times
// environment-mode steps beside `docker exec` (EnvStep). FakeWorkers is a
// simulated fleet of cluster workers at the NATS level, to load one
// coordinator (rollbox serve --cluster) without sandboxes.
package loadgen

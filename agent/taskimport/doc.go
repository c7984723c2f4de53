// Package taskimport turns the task formats trainers' data sets come in
// into Rollbox tasks: Harbor (Terminal-Bench 2) task directories and
// SWE-bench-style instances. Verification stays out of the agent's reach:
// an imported task's tests are hidden tests, written into the verifier's
// fresh sandbox only after the agent finished (package reward's clean
// room). What cannot be mapped is reported per task (Result.Problems),
// never dropped: an error keeps the task out of the task file, a warning
// or a note says how it will differ from its source.
//
// Container images are built or inspected through an ImageBuilder (the
// local Docker engine, wired up in cmd), without network.
package taskimport

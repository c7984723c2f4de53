// Package sandbox defines what Rollbox asks of an isolated place to run
// untrusted, model-written code: a Spec that describes it, a Backend that
// creates it, a Sandbox that executes commands and moves files, the Result of
// one command, and the error kinds that separate "the command failed" (a
// Result with a non-zero exit) from "the sandbox failed" (an error).
//
// Backends live in sub-packages named after what they wrap (sandbox/docker,
// sandbox/wasm). This package imports none of their clients.
package sandbox

// Package wasm is the embedded sandbox backend: it needs nothing but this
// binary (and Go, the first time, to build its guests). An episode's state is
// an in-memory filesystem capped at DiskMB+TmpMB; its shell command lines run
// in this process on the mvdan.cc/sh interpreter, confined to that
// filesystem and bounded by a guard; python, js and any user .wasm run as
// WASI modules on one shared wazero runtime with an on-disk compilation
// cache, each instance capped in memory, time and output. An idle episode
// costs only its files. RATIONALE.md records why it is built this way.
package wasm

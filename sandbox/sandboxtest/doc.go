// Package sandboxtest is the conformance suite every sandbox backend runs:
// exec and exit codes, stdin, env and workdir, timeouts that leave nothing
// running, output caps, OOM, fork bombs, network, files, concurrency and
// Close while busy. A behaviour that cannot exist on a backend (signals in
// WASI) is declared in Options and reported by name, never skipped silently.
package sandboxtest

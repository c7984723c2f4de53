// Package testreport reads what a test runner reports about named tests:
// JUnit XML (pytest's --junitxml, and most runners'), `go test -json`
// events, and TAP (the shape of shell-script tests). A report is untrusted
// input (the code under test ran beside the runner): the parsers bound what
// they keep and never fail open, and a report that cannot be complete (a
// runner that exited early) says so.
package testreport

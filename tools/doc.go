// Package tools is the registry of tools an agent may call, each with an
// OpenAI function-calling JSON schema that its arguments are validated
// against, and the tools themselves: bash, python, read_file, write_file,
// edit, run_tests and finish. A tool failure is a Result with a closed-list
// error kind that the model reads; a Go error from a tool means the sandbox
// (infrastructure) failed.
package tools

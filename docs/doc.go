// Package docs holds Rollbox's documentation (the Markdown files beside
// this one) and the tests that keep it true: every task example parses,
// every task field, tool, reward type, trajectory field and HTTP route is
// documented as the code has it, docs/api.md is generated from
// runtime/openapi.json, the CLI reference from the commands, and every
// command the README and these pages show that needs no GPU runs against
// the real binary (TestEveryDocumentedCommandRuns; notRun says why the
// others do not).
package docs

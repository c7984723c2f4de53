// Package docs holds Rollbox's documentation (the Markdown files beside
// this one) and the tests that keep it true: every task example parses,
// every task field, tool, reward type, trajectory field and HTTP route is
// documented as the code has it, docs/api.md is generated from
// runtime/openapi.json and the CLI reference from the commands.
package docs

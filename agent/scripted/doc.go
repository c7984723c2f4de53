// Package scripted is an agent.Policy that replays assistant turns from a
// JSONL file, for tests, demos and the examples in the repository: no
// model, no server, the same turns every time.
//
// Each line scripts one task:
//
//	{"task_id": "fix-add", "turns": [
//	  {"content": "Let me look.", "tool_calls": [{"name": "read_file", "arguments": {"path": "/work/calc.py"}}]},
//	  {"tool_calls": [{"name": "edit", "arguments": "{\"path\": \"/work/calc.py\", oops"}]},
//	  {"error": "upstream 503"},
//	  {"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}}], "finish_reason": "tool_calls"}]}
//
// A turn has optional "content", "tool_calls", "finish_reason" and
// "usage" ({"prompt_tokens", "completion_tokens", "total_tokens"}), or an
// "error" alone, which makes that turn fail as a policy error. A call's
// "arguments" is a JSON object (sent as its compact text) or a string
// (sent verbatim, so a script can feed a tool invalid JSON); a call
// without "id" gets "call_<turn>_<i>". Request.TaskID picks the script and
// Request.Turn the turn. A line may give "prompt" instead of "task_id": it
// scripts the episodes whose prompt (first user message, spaces at the ends
// aside) is that text when no script has their task id, which is how a
// frozen sub-agent policy is scripted per sub-task.
//
// Load reads and checks the whole file before returning, so a bad script
// is refused before anything runs, with the line and field named.
package scripted

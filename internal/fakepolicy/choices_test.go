package fakepolicy

import (
	"strings"
	"testing"
)

func TestChoicesPlayEachConversationInTurn(t *testing.T) {
	f, err := ParseChoiceFile([]byte(`{"scripts": [{"match": "2+2", "choices": [
		[{"tool_calls": [{"name": "bash", "arguments": {"command": "echo 4"}}]}, {"tool_calls": [{"name": "finish", "arguments": "{\"answer\": \"4\"}"}]}],
		[{"content": "guess", "tool_calls": [{"name": "finish", "arguments": {"answer": "5"}}]}]]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	respond := Choices(f)
	user := Message{Role: "user", Content: "What is 2+2?"}
	first := respond(&Request{Messages: []Message{user}})
	second := respond(&Request{Messages: []Message{user}})
	if first.Content != "[choice 0]" || first.ToolCalls[0].Name != "bash" || first.ToolCalls[0].Arguments != `{"command": "echo 4"}` {
		t.Fatalf("first conversation: %+v", first)
	}
	if second.Content != "[choice 1] guess" || second.ToolCalls[0].Arguments != `{"answer": "5"}` {
		t.Fatalf("second conversation: %+v", second)
	}
	// Turn 1 of the first conversation follows its own choice, read from the
	// conversation, whatever was asked in between.
	next := respond(&Request{Messages: []Message{user, {Role: "assistant", Content: first.Content}, {Role: "tool", Content: "4"}}})
	if next.ToolCalls[0].Name != "finish" || next.ToolCalls[0].Arguments != `{"answer": "4"}` {
		t.Fatalf("turn 1 of choice 0: %+v", next)
	}
	// Past the end of its choice: a plain answer.
	done := respond(&Request{Messages: []Message{user, {Role: "assistant", Content: "[choice 1] guess"}, {Role: "tool"}}})
	if len(done.ToolCalls) != 0 {
		t.Fatalf("past the end: %+v", done)
	}
	if r := respond(&Request{Messages: []Message{{Role: "user", Content: "something else"}}}); r.Content != "ok" {
		t.Fatalf("no match: %+v", r)
	}
}

func TestParseChoiceFileNamesTheField(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"scripts": [{"choices": [[]]}]}`, "scripts[0].match"},
		{`{"scripts": [{"match": "x"}]}`, "scripts[0].choices"},
		{`{"scripts": [{"match": "x", "choices": [[{"tool_calls": [{"arguments": {}}]}]]}]}`, "scripts[0].choices[0][0].tool_calls[0].name"},
		{`{"scripts": [], "extra": 1}`, "unknown field"},
	} {
		if _, err := ParseChoiceFile([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.doc, err, tc.want)
		}
	}
}

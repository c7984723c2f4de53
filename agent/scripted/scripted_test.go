package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/agent"
)

// script has a blank line and CRLF line ends, which Load accepts.
const script = `{"task_id": "fix-add", "turns": [` +
	`{"content": "Let me look.", "tool_calls": [{"name": "read_file", "arguments": {"path": "/work/calc.py", "start_line": 1}}]}, ` +
	`{"tool_calls": [{"id": "mine", "name": "edit", "arguments": "{\"path\": \"/work/calc.py\", oops"}, {"name": "run_tests"}]}, ` +
	`{"error": "upstream 503"}, ` +
	`{"content": "Done.", "finish_reason": "length", "usage": {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}}]}` +
	"\r\n\r\n" +
	`{"task_id": "answer", "turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "4"}}]}]}`

func load(t *testing.T, text string) (*Policy, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.jsonl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(path)
}

func TestLoadRefusesBadFiles(t *testing.T) {
	good := `{"task_id": "a", "turns": [{"content": "x"}]}` + "\n"
	tests := []struct {
		name string
		text string
		want string
	}{
		{name: "invalid JSON names its line", text: good + "\n" + `{"task_id": "b", "turns": [` + "\n", want: "line 3: not a JSON object: invalid JSON"},
		{name: "a line that is not an object is refused", text: `["a"]`, want: "line 1: not a JSON object: an array"},
		{name: "a missing task_id is refused", text: good + `{"turns": [{"content": "x"}]}`, want: "line 2: task_id: missing"},
		{name: "an empty task_id is refused", text: `{"task_id": "", "turns": [{}]}`, want: "line 1: task_id: empty"},
		{name: "a task_id that is not a string is refused", text: `{"task_id": 7, "turns": [{}]}`, want: "line 1: task_id: must be a string, not a number"},
		{name: "a duplicate task id names both lines", text: good + good, want: `line 2: task_id "a" is already scripted on line 1`},
		{name: "missing turns are refused", text: `{"task_id": "a"}`, want: "line 1: turns: missing"},
		{name: "empty turns are refused", text: `{"task_id": "a", "turns": []}`, want: "line 1: turns: empty"},
		{name: "an unknown top-level field is refused", text: `{"task_id": "a", "turns": [{}], "turn": 1}`, want: "line 1: turn: unknown field (known: task_id, prompt, turns)"},
		{name: "an unknown turn field is refused", text: `{"task_id": "a", "turns": [{}, {"tool_call": []}]}`, want: "line 1: turns[1].tool_call: unknown field"},
		{name: "content that is not a string is refused", text: `{"task_id": "a", "turns": [{"content": 1}]}`, want: "turns[0].content: must be a string, not a number"},
		{name: "a call without a name is refused", text: `{"task_id": "a", "turns": [{"tool_calls": [{"arguments": {}}]}]}`, want: "turns[0].tool_calls[0].name: missing"},
		{name: "arguments that are a number are refused", text: `{"task_id": "a", "turns": [{"tool_calls": [{"name": "x", "arguments": 3}]}]}`, want: "turns[0].tool_calls[0].arguments: must be a JSON object or a string, not a number"},
		{name: "tool_calls that are not an array are refused", text: `{"task_id": "a", "turns": [{"tool_calls": {}}]}`, want: "turns[0].tool_calls: must be an array, not an object"},
		{name: "an error with tool calls is refused", text: `{"task_id": "a", "turns": [{"error": "x", "tool_calls": []}]}`, want: "turns[0]: error cannot be combined with tool_calls"},
		{name: "an empty error is refused", text: `{"task_id": "a", "turns": [{"error": ""}]}`, want: "turns[0].error: empty"},
		{name: "bad usage is refused", text: `{"task_id": "a", "turns": [{"usage": {"prompt": 1}}]}`, want: "turns[0].usage: want"},
		{name: "a file without scripts is refused", text: "\n  \n", want: "no scripts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := load(t, tt.text)
			if p != nil || !errors.Is(err, ErrInvalidScript) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "script.jsonl") {
				t.Fatalf("Load = %v, %v; want ErrInvalidScript naming the file and %q", p, err, tt.want)
			}
		})
	}
	t.Run("a missing file is an error that is not ErrInvalidScript", func(t *testing.T) {
		_, err := Load(filepath.Join(t.TempDir(), "nope.jsonl"))
		if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalidScript) {
			t.Fatalf("Load: %v", err)
		}
	})
}

func TestReplay(t *testing.T) {
	p, err := load(t, script)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Tasks(); !reflect.DeepEqual(got, []string{"answer", "fix-add"}) {
		t.Fatalf("Tasks = %v", got)
	}
	if !p.Has("answer") || p.Has("nope") {
		t.Fatal("Has disagrees with the file")
	}
	tests := []struct {
		name    string
		task    string
		turn    int
		want    agent.Turn // Raw and Latency are checked apart
		wantErr string
	}{
		{
			name: "object arguments are sent as compact text and ids are assigned",
			task: "fix-add", turn: 0,
			want: agent.Turn{Content: "Let me look.", FinishReason: "tool_calls", Model: "scripted", Attempts: 1,
				ToolCalls: []agent.ToolCall{{ID: "call_0_0", Name: "read_file", Arguments: `{"path":"/work/calc.py","start_line":1}`}}},
		},
		{
			name: "string arguments are sent verbatim and scripted ids are kept",
			task: "fix-add", turn: 1,
			want: agent.Turn{FinishReason: "tool_calls", Model: "scripted", Attempts: 1, ToolCalls: []agent.ToolCall{
				{ID: "mine", Name: "edit", Arguments: `{"path": "/work/calc.py", oops`},
				{ID: "call_1_1", Name: "run_tests", Arguments: `{}`},
			}},
		},
		{
			name: "an error turn is a policy error",
			task: "fix-add", turn: 2,
			want:    agent.Turn{Model: "scripted", Attempts: 1},
			wantErr: `script for task "fix-add" turn 2: upstream 503`,
		},
		{
			name: "finish reason and usage are replayed",
			task: "fix-add", turn: 3,
			want: agent.Turn{Content: "Done.", FinishReason: "length", Model: "scripted", Attempts: 1,
				Usage: &agent.Usage{PromptTokens: 100, CompletionTokens: 2, TotalTokens: 102}},
		},
		{
			name: "running out of turns is a policy error",
			task: "fix-add", turn: 4,
			want:    agent.Turn{Model: "scripted"},
			wantErr: `script for task "fix-add" has 4 turns; turn 4 was asked for`,
		},
		{
			name: "an unknown task is a policy error",
			task: "nope", turn: 0,
			wantErr: `no script for task "nope"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.Next(context.Background(), agent.Request{TaskID: tt.task, Turn: tt.turn})
			if tt.wantErr != "" {
				if !errors.Is(err, agent.ErrPolicy) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want ErrPolicy containing %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if tt.want.Attempts == 1 && !json.Valid(got.Raw) {
				t.Errorf("Raw %q is not the scripted turn", got.Raw)
			}
			got.Raw, got.Latency = nil, 0
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("turn\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	t.Run("a cancelled context returns its error", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := p.Next(ctx, agent.Request{TaskID: "answer"}); !errors.Is(err, context.Canceled) || errors.Is(err, agent.ErrPolicy) {
			t.Fatalf("Next: %v", err)
		}
	})
	t.Run("callers cannot change the script through a returned turn", func(t *testing.T) {
		first, _ := p.Next(context.Background(), agent.Request{TaskID: "answer"})
		first.ToolCalls[0].Name = "changed"
		again, _ := p.Next(context.Background(), agent.Request{TaskID: "answer"})
		if again.ToolCalls[0].Name != "finish" {
			t.Fatalf("script changed: %+v", again.ToolCalls)
		}
	})
	t.Run("concurrent episodes replay independently", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				turn, err := p.Next(context.Background(), agent.Request{TaskID: "fix-add", Turn: i % 2})
				if err != nil || len(turn.ToolCalls) == 0 {
					t.Errorf("Next: %+v, %v", turn, err)
				}
			})
		}
		wg.Wait()
	})
}

func ExampleRead() {
	p, err := Read(strings.NewReader(`{"task_id": "t", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}]}`))
	if err != nil {
		panic(err)
	}
	turn, _ := p.Next(context.Background(), agent.Request{TaskID: "t", Turn: 0})
	fmt.Println(turn.ToolCalls[0].ID, turn.ToolCalls[0].Name, turn.ToolCalls[0].Arguments, turn.FinishReason)
	_, err = p.Next(context.Background(), agent.Request{TaskID: "t", Turn: 1})
	fmt.Println(err)
	// Output:
	// call_0_0 bash {"command":"ls"} tool_calls
	// policy error: script for task "t" has 1 turns; turn 1 was asked for
}

func FuzzRead(f *testing.F) {
	f.Add(script)
	f.Add(`{"task_id": "a", "turns": [{"tool_calls": [{"name": "x", "arguments": "{"}]}]}`)
	f.Add(`{"task_id": "a", "turns": [{"error": "boom"}, {"usage": {"prompt_tokens": 1}}]}`)
	f.Add("{}\n[]\nnull\n")
	f.Fuzz(func(t *testing.T, text string) {
		p, err := Read(strings.NewReader(text))
		if err != nil {
			if !errors.Is(err, ErrInvalidScript) {
				t.Fatalf("error %v does not wrap ErrInvalidScript", err)
			}
			return
		}
		for _, id := range p.Tasks() {
			for turn := 0; ; turn++ {
				got, err := p.Next(context.Background(), agent.Request{TaskID: id, Turn: turn})
				if err != nil {
					if !errors.Is(err, agent.ErrPolicy) {
						t.Fatalf("Next: %v", err)
					}
					if strings.Contains(err.Error(), "turns; turn") {
						break
					}
					continue
				}
				for _, c := range got.ToolCalls {
					if c.ID == "" || c.Name == "" {
						t.Fatalf("call %+v", c)
					}
				}
			}
		}
	})
}

// A frozen sub-agent is scripted by its sub-task's prompt: its task id is
// its orchestrator task's, shared by every sub-agent.
func TestAScriptMayBePickedByThePrompt(t *testing.T) {
	p, err := Read(strings.NewReader(`{"prompt": "find A", "turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "a"}}]}]}
{"prompt": "find B", "turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "b"}}]}]}
{"task_id": "orch.sub", "turns": [{"content": "by id"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(id, prompt string) (agent.Turn, error) {
		return p.Next(context.Background(), agent.Request{TaskID: id, Messages: []agent.Message{{Role: agent.RoleSystem, Content: "s"}, {Role: agent.RoleUser, Content: prompt}}})
	}
	if turn, err := ask("x.sub", "  find B\n"); err != nil || turn.ToolCalls[0].Arguments != `{"answer":"b"}` {
		t.Errorf("by prompt: %+v %v", turn, err)
	}
	if turn, err := ask("orch.sub", "find A"); err != nil || turn.Content != "by id" {
		t.Errorf("a task id's script comes first: %+v %v", turn, err)
	}
	if _, err := ask("x.sub", "find C"); !errors.Is(err, agent.ErrPolicy) || !strings.Contains(err.Error(), "or its prompt") {
		t.Errorf("no script: %v", err)
	}
	if _, err := Read(strings.NewReader(`{"task_id": "a", "prompt": "b", "turns": []}`)); err == nil || !strings.Contains(err.Error(), "give one") {
		t.Errorf("task_id and prompt: %v", err)
	}
}

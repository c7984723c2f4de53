package toolparse

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseHermes(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		content string
		calls   []Call
		wantErr string // substring; empty means no error
	}{
		{
			name:    "text without markup comes back unchanged",
			text:    "  The answer is 4.\n",
			content: "  The answer is 4.\n",
		},
		{
			name:    "one block with object arguments is compacted",
			text:    "I'll list the files.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\", \"timeout_s\": 5}}\n</tool_call>",
			content: "I'll list the files.",
			calls:   []Call{{Name: "bash", Arguments: `{"command":"ls -la","timeout_s":5}`}},
		},
		{
			name: "several blocks keep their order and the text between them",
			text: "a<tool_call>{\"name\":\"read_file\",\"arguments\":{\"path\":\"/x\"}}</tool_call>b\n" +
				"<tool_call>{\"name\":\"bash\",\"arguments\":{\"command\":\"true\"}}</tool_call>c",
			content: "ab\nc",
			calls: []Call{
				{Name: "read_file", Arguments: `{"path":"/x"}`},
				{Name: "bash", Arguments: `{"command":"true"}`},
			},
		},
		{
			name:  "string arguments are used verbatim even when they are not JSON",
			text:  `<tool_call>{"name": "edit", "arguments": "{\"path\": \"/a\", oops"}</tool_call>`,
			calls: []Call{{Name: "edit", Arguments: `{"path": "/a", oops`}},
		},
		{
			name:  "missing arguments become an empty object",
			text:  `<tool_call>{"name": "run_tests"}</tool_call>`,
			calls: []Call{{Name: "run_tests", Arguments: `{}`}},
		},
		{
			name:  "parameters are accepted in place of arguments",
			text:  `<tool_call>{"name": "search", "parameters": {"query": "go"}}</tool_call>`,
			calls: []Call{{Name: "search", Arguments: `{"query":"go"}`}},
		},
		{
			name:  "non-object arguments are kept as their JSON text for the tool to refuse",
			text:  `<tool_call>{"name": "prune", "arguments": [1, 2]}</tool_call>`,
			calls: []Call{{Name: "prune", Arguments: `[1,2]`}},
		},
		{
			name:    "an unclosed last block whose JSON is whole is accepted",
			text:    "ok\n<tool_call>\n{\"name\": \"finish\", \"arguments\": {\"answer\": \"4\"}}\n",
			content: "ok",
			calls:   []Call{{Name: "finish", Arguments: `{"answer":"4"}`}},
		},
		{
			name:    "markup with invalid JSON is left as content",
			text:    `Let me try <tool_call>{"name": "bash", "arguments": {"command": }</tool_call>`,
			content: `Let me try <tool_call>{"name": "bash", "arguments": {"command": }</tool_call>`,
			wantErr: "block 1 at byte 11",
		},
		{
			name:    "one bad block among good ones leaves everything as content",
			text:    `<tool_call>{"name":"bash","arguments":{}}</tool_call><tool_call>{"arguments":{}}</tool_call>`,
			content: `<tool_call>{"name":"bash","arguments":{}}</tool_call><tool_call>{"arguments":{}}</tool_call>`,
			wantErr: `block 2 at byte 53: "name" is missing`,
		},
		{
			name:    "an empty name is refused",
			text:    `<tool_call>{"name": "", "arguments": {}}</tool_call>`,
			content: `<tool_call>{"name": "", "arguments": {}}</tool_call>`,
			wantErr: `"name" is empty`,
		},
		{
			name:    "a body that is not an object is refused",
			text:    `<tool_call>["bash"]</tool_call>`,
			content: `<tool_call>["bash"]</tool_call>`,
			wantErr: "not a JSON object",
		},
		{
			name:    "nested blocks are refused",
			text:    `<tool_call>{"name": "a"<tool_call>{"name": "b"}</tool_call>`,
			content: `<tool_call>{"name": "a"<tool_call>{"name": "b"}</tool_call>`,
			wantErr: "inside a block",
		},
		{
			name:    "a stray closing tag is refused",
			text:    `<tool_call>{"name": "a"}</tool_call></tool_call>`,
			content: `<tool_call>{"name": "a"}</tool_call></tool_call>`,
			wantErr: "without a matching",
		},
		{
			name:    "an unclosed block followed by more text is refused",
			text:    "<tool_call>{\"name\": \"a\"}\nand then some",
			content: "<tool_call>{\"name\": \"a\"}\nand then some",
			wantErr: "not closed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			content, calls, err := ParseHermes(tt.text)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseHermes: unexpected error %v", err)
				}
			} else {
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseHermes: error %v, want ErrMalformed containing %q", err, tt.wantErr)
				}
			}
			if content != tt.content {
				t.Errorf("content = %q, want %q", content, tt.content)
			}
			if !reflect.DeepEqual(calls, tt.calls) {
				t.Errorf("calls = %#v, want %#v", calls, tt.calls)
			}
		})
	}
}

func TestParseFunctionTags(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		content string
		calls   []Call
		wantErr string
	}{
		{
			name:    "a Llama style call is parsed",
			text:    "Running it.\n<function=bash>{\"command\": \"ls\"}</function>",
			content: "Running it.",
			calls:   []Call{{Name: "bash", Arguments: `{"command":"ls"}`}},
		},
		{
			name:  "an empty body means no arguments",
			text:  `<function=run_tests></function>`,
			calls: []Call{{Name: "run_tests", Arguments: `{}`}},
		},
		{
			name:    "a name with spaces is refused",
			text:    `<function=rm -rf>{}</function>`,
			content: `<function=rm -rf>{}</function>`,
			wantErr: "character other than",
		},
		{
			name:    "a body that is not JSON is refused",
			text:    `<function=bash>ls</function>`,
			content: `<function=bash>ls</function>`,
			wantErr: "not JSON",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			content, calls, err := ParseFunctionTags(tt.text)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tt.wantErr != "" && (!errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want ErrMalformed containing %q", err, tt.wantErr)
			}
			if content != tt.content {
				t.Errorf("content = %q, want %q", content, tt.content)
			}
			if !reflect.DeepEqual(calls, tt.calls) {
				t.Errorf("calls = %#v, want %#v", calls, tt.calls)
			}
		})
	}
}

func TestParsePicksTheFormat(t *testing.T) {
	t.Run("Hermes markup wins when both are present", func(t *testing.T) {
		_, calls, err := Parse(`<tool_call>{"name":"a"}</tool_call><function=b>{}</function>`)
		if err != nil || len(calls) != 1 || calls[0].Name != "a" {
			t.Fatalf("Parse = %v, %v", calls, err)
		}
	})
	t.Run("function tags are used when there is no Hermes markup", func(t *testing.T) {
		_, calls, err := Parse(`<function=b>{"x":1}</function>`)
		if err != nil || len(calls) != 1 || calls[0].Name != "b" {
			t.Fatalf("Parse = %v, %v", calls, err)
		}
	})
	t.Run("Qwen3-Coder XML parameters are reported as malformed", func(t *testing.T) {
		text := "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
		content, calls, err := Parse(text)
		if !errors.Is(err, ErrMalformed) || calls != nil || content != text {
			t.Fatalf("Parse = %q, %v, %v", content, calls, err)
		}
	})
}

// renderHermes writes calls as Hermes blocks with string arguments, which
// ParseHermes must read back exactly.
func renderHermes(calls []Call) string {
	var b strings.Builder
	for _, c := range calls {
		block, _ := json.Marshal(map[string]string{"name": c.Name, "arguments": c.Arguments})
		fmt.Fprintf(&b, "<tool_call>%s</tool_call>\n", block)
	}
	return b.String()
}

func FuzzParseHermes(f *testing.F) {
	for _, seed := range []string{
		"",
		"plain text",
		`<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>`,
		`a<tool_call>{"name":"x","arguments":"{\"k\":1}"}</tool_call>b<tool_call>{"name":"y"}</tool_call>`,
		`<tool_call>{"name": "bash"`,
		`<tool_call><tool_call></tool_call>`,
		`</tool_call><tool_call>`,
		`<tool_call>{"name":"a","parameters":null}`,
		"<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
		`<function=bash>{"command":"ls"}</function>`,
		`<tool_call>{"name":"\xff","arguments":{"\xfe":1}}</tool_call>`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, parse := range []func(string) (string, []Call, error){ParseHermes, ParseFunctionTags, Parse} {
			content, calls, err := parse(text)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("error %v does not wrap ErrMalformed", err)
				}
				if content != text || calls != nil {
					t.Fatalf("malformed markup must come back as content with no calls; got %q, %v", content, calls)
				}
				continue
			}
			if calls == nil && content != text {
				t.Fatalf("no calls, but content %q differs from text %q", content, text)
			}
			for _, c := range calls {
				if c.Name == "" {
					t.Fatalf("call with an empty name from %q", text)
				}
			}
		}

		// Whatever ParseHermes finds, it reads back from its own rendering.
		_, calls, err := ParseHermes(text)
		if err != nil || len(calls) == 0 {
			return
		}
		for _, c := range calls {
			if !utf8.ValidString(c.Name) || !utf8.ValidString(c.Arguments) {
				return // JSON rendering would replace the invalid bytes
			}
		}
		content, again, err := ParseHermes(renderHermes(calls))
		if err != nil || content != "" || !reflect.DeepEqual(again, calls) {
			t.Fatalf("round trip of %#v gave %q, %#v, %v", calls, content, again, err)
		}
	})
}

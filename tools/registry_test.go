package tools

import (
	"context"
	"strings"
	"testing"
)

func TestCallRefusesBadArgumentsWithAKindTheModelReads(t *testing.T) {
	reg, err := Select(BuiltinNames(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool, args string
		kind             ErrorKind
		want             string
	}{
		{"invalid JSON", "bash", `{"command": "ls"`, KindBadArguments, "not valid JSON"},
		{"a non-object", "bash", `["ls"]`, KindBadArguments, "must be a JSON object"},
		{"a missing required argument", "bash", `{}`, KindBadArguments, `missing required argument "command"`},
		{"a wrong type", "bash", `{"command": 5}`, KindBadArguments, `"command" must be a string`},
		{"an unknown argument", "edit", `{"path": "a", "old_string": "x", "new_string": "y", "force": true}`, KindBadArguments, `unknown argument "force"`},
		{"an empty required string", "bash", `{"command": ""}`, KindBadArguments, "must not be empty"},
		{"an out-of-range integer", "bash", `{"command": "ls", "timeout_s": 0}`, KindBadArguments, "at least 1"},
		{"a fractional integer", "read_file", `{"path": "a", "start_line": 1.5}`, KindBadArguments, "must be an integer"},
		{"an unknown tool", "rm_rf", `{}`, KindUnknownTool, `unknown tool "rm_rf"`},
		{"two JSON values", "bash", `{"command": "a"} {"command": "b"}`, KindBadArguments, "more than one JSON value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := reg.Call(context.Background(), &Env{}, tt.tool, tt.args)
			if err != nil {
				t.Fatalf("bad arguments must be a Result, got error %v", err)
			}
			if res.ErrorKind != tt.kind || !strings.Contains(res.Text, tt.want) {
				t.Errorf("kind %q text %q, want %q containing %q", res.ErrorKind, res.Text, tt.kind, tt.want)
			}
		})
	}
}

func TestFinishTakesAnAnswerAndIDs(t *testing.T) {
	reg, _ := Select([]string{"finish"}, nil)
	res, err := reg.Call(context.Background(), &Env{}, "finish", `{"answer": "42", "ids": ["a", "b"]}`)
	if err != nil || res.Finish == nil || *res.Finish.Answer != "42" || strings.Join(res.Finish.IDs, ",") != "a,b" {
		t.Fatalf("finish = %+v, %v", res.Finish, err)
	}
	res, _ = reg.Call(context.Background(), &Env{}, "finish", ``)
	if res.Finish == nil || res.Finish.Answer != nil {
		t.Fatalf("finish with no arguments = %+v", res.Finish)
	}
}

func TestSchemasAreOpenAIFunctionDefinitions(t *testing.T) {
	reg, _ := Select(BuiltinNames(), nil)
	for _, s := range reg.Schemas() {
		if s.Name == "" || s.Description == "" || !strings.Contains(string(s.Parameters), `"type":"object"`) {
			t.Errorf("schema %+v", s)
		}
	}
}

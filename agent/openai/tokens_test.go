package openai_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/openai"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

func TestTokenModeIsRefusedByAServerWithoutATokenizerEndpoint(t *testing.T) {
	srv, err := fakepolicy.Start(fakepolicy.Config{NoTokenizer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = openai.NewTokens(context.Background(), openai.Config{BaseURL: srv.URL(), Model: "m", MaxRetries: -1})
	if err == nil || !errors.Is(err, agent.ErrPolicy) || !strings.Contains(err.Error(), "no tokenizer endpoint") || !strings.Contains(err.Error(), "/tokenize") {
		t.Fatalf("err = %v", err)
	}
}

func TestTokenModeContinuesTheSequenceWithTheServersRenderingOfTheNewMessages(t *testing.T) {
	srv, err := fakepolicy.Start(fakepolicy.Config{Record: true, Responder: fakepolicy.BashThenFinish(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	p, err := openai.NewTokens(ctx, openai.Config{BaseURL: srv.URL(), Model: "fake-model"})
	if err != nil {
		t.Fatal(err)
	}
	info := p.Tokenizer()
	if info.Fingerprint == "" || info.Revision == "" || !slices.Equal(info.CloseIDs, []int64{fakepolicy.TokIMEnd, '\n'}) {
		t.Fatalf("tokenizer = %+v", info)
	}
	msgs := []agent.Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "do it"}}
	t0, err := p.Next(ctx, agent.Request{Turn: 0, Messages: msgs, Tokens: &agent.TokenContext{}})
	if err != nil {
		t.Fatal(err)
	}
	want := fakepolicy.Encode(fakepolicy.RenderChat([]fakepolicy.Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "do it"}}, nil, true))
	if !slices.Equal(t0.Tokens.Prompt, want) {
		t.Fatalf("first prompt\n%v\nwant\n%v", t0.Tokens.Prompt, want)
	}
	if len(t0.ToolCalls) != 1 || t0.ToolCalls[0].Name != "bash" || t0.Tokens.Completion[len(t0.Tokens.Completion)-1] != fakepolicy.TokIMEnd || len(t0.Tokens.Logprobs) != len(t0.Tokens.Completion) {
		t.Fatalf("turn 0 = %+v", t0)
	}
	prefix := append(append([]int64{}, t0.Tokens.Prompt...), t0.Tokens.Completion...)
	msgs = append(msgs, agent.Message{Role: "assistant", Text: t0.Text, ToolCalls: t0.ToolCalls},
		agent.Message{Role: "tool", Content: "ok", ToolCallID: t0.ToolCalls[0].ID})
	t1, err := p.Next(ctx, agent.Request{Turn: 1, Messages: msgs, Tokens: &agent.TokenContext{Prefix: prefix, New: 3}})
	if err != nil {
		t.Fatal(err)
	}
	text, _ := fakepolicy.Decode(t1.Tokens.Prompt)
	prev, _ := fakepolicy.Decode(prefix)
	if want := prev + "\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"; text != want {
		t.Fatalf("second prompt\n%q\nwant\n%q", text, want)
	}
	reqs := srv.Requests()
	if got := reqs[len(reqs)-1].Prompt; got != text {
		t.Fatalf("the server saw %q", got)
	}
}

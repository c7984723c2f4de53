package fakepolicy

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The fake tokenizer of the token endpoints: every byte is a token (its
// value is its id) and three special tokens, matched as whole strings
// wherever they appear in text the server tokenizes (as Hugging Face
// tokenizers do), have ids above 255.
const (
	TokIMStart    = 256 // <|im_start|>
	TokIMEnd      = 257 // <|im_end|>, the end-of-sequence token the model samples
	TokEndOfText  = 258 // <|endoftext|>
	VocabSize     = 259
	FakeRevision  = "fakepolicy-chatml-bytes-1"
	specialPrefix = "<|"
)

var specials = []struct {
	text string
	id   int64
}{{"<|im_start|>", TokIMStart}, {"<|im_end|>", TokIMEnd}, {"<|endoftext|>", TokEndOfText}}

// Encode tokenizes text: special token strings become their ids, every
// other byte its own id.
func Encode(text string) []int64 {
	ids := make([]int64, 0, len(text))
	for i := 0; i < len(text); {
		if strings.HasPrefix(text[i:], specialPrefix) {
			matched := false
			for _, sp := range specials {
				if strings.HasPrefix(text[i:], sp.text) {
					ids = append(ids, sp.id)
					i += len(sp.text)
					matched = true
					break
				}
			}
			if matched {
				continue
			}
		}
		ids = append(ids, int64(text[i]))
		i++
	}
	return ids
}

// Decode turns ids back into text; special ids become their strings.
//
// # Errors
//
// An id outside the vocabulary.
func Decode(ids []int64) (string, error) {
	var b strings.Builder
	for i, id := range ids {
		switch {
		case id >= 0 && id < 256:
			b.WriteByte(byte(id))
		case id >= TokIMStart && id < VocabSize:
			b.WriteString(specials[id-TokIMStart].text)
		default:
			return "", fmt.Errorf("token %d (position %d) is outside the vocabulary of %d", id, i, VocabSize)
		}
	}
	return b.String(), nil
}

// DefaultSystem is what the chat template puts first when the
// conversation has no system message (as Qwen2.5's template does).
const DefaultSystem = "You are a helpful assistant."

// RenderChat is the server's chat template, a Qwen2.5-style ChatML: each
// message is <|im_start|>ROLE\nCONTENT<|im_end|>\n; tools are listed in the
// system message; an assistant's tool calls follow its content as
// <tool_call> blocks; consecutive tool results are one user message of
// <tool_response> blocks; the generation prompt is <|im_start|>assistant\n.
func RenderChat(msgs []Message, tools []Tool, addGenerationPrompt bool) string {
	var b strings.Builder
	system, rest := DefaultSystem, msgs
	if len(msgs) > 0 && msgs[0].Role == "system" {
		system, rest = msgs[0].Content, msgs[1:]
	}
	b.WriteString("<|im_start|>system\n" + system)
	if len(tools) > 0 {
		b.WriteString("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>")
		for _, t := range tools {
			fn, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": t.Name, "description": t.Description, "parameters": t.Parameters}})
			b.WriteString("\n" + string(fn))
		}
		b.WriteString("\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> tags.")
	}
	b.WriteString("<|im_end|>\n")
	for i, m := range rest {
		switch m.Role {
		case "tool":
			if i == 0 || rest[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if i == len(rest)-1 || rest[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		case "assistant":
			b.WriteString("<|im_start|>assistant\n" + m.Content)
			for j, tc := range m.ToolCalls {
				if m.Content != "" || j > 0 {
					b.WriteString("\n")
				}
				b.WriteString(toolCallText(tc))
			}
			b.WriteString("<|im_end|>\n")
		default:
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		}
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

func toolCallText(tc ToolCall) string {
	name, _ := json.Marshal(tc.Name)
	args := tc.Arguments
	if !json.Valid([]byte(args)) {
		quoted, _ := json.Marshal(args)
		args = string(quoted)
	}
	return fmt.Sprintf("<tool_call>\n{\"name\": %s, \"arguments\": %s}\n</tool_call>", name, args)
}

// ParsePrompt reads a ChatML prompt back into messages (the server's own
// template, so a Responder sees the conversation in token mode too): tool
// responses become tool messages, an assistant's text is its content as
// sampled (tool-call markup included).
func ParsePrompt(text string) []Message {
	var out []Message
	for _, block := range strings.Split(text, "<|im_start|>")[1:] {
		block, closed := strings.CutSuffix(strings.TrimSuffix(block, "\n"), "<|im_end|>")
		role, content, _ := strings.Cut(block, "\n")
		if !closed && role == "assistant" && content == "" {
			continue // the generation prompt
		}
		if role == "user" && strings.HasPrefix(content, "\n<tool_response>\n") {
			for _, part := range strings.Split(content, "\n<tool_response>\n")[1:] {
				out = append(out, Message{Role: "tool", Content: strings.TrimSuffix(part, "\n</tool_response>")})
			}
			continue
		}
		out = append(out, Message{Role: role, Content: content})
	}
	return out
}

// wire types of the token endpoints (vLLM's).

type wireTokenizeRequest struct {
	Model               string        `json:"model"`
	Prompt              *string       `json:"prompt"`
	Messages            []wireMessage `json:"messages"`
	Tools               []wireTool    `json:"tools"`
	AddGenerationPrompt bool          `json:"add_generation_prompt"`
	AddSpecialTokens    *bool         `json:"add_special_tokens"`
}

type wireCompletionRequest struct {
	Model                  string          `json:"model"`
	Prompt                 json.RawMessage `json:"prompt"`
	MaxTokens              *int            `json:"max_tokens"`
	Logprobs               *int            `json:"logprobs"`
	ReturnTokensAsTokenIDs bool            `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool            `json:"return_token_ids"`
	Stream                 bool            `json:"stream"`
}

type wireCompletionChoice struct {
	Index          int               `json:"index"`
	Text           string            `json:"text"`
	Logprobs       *wireTextLogprobs `json:"logprobs"`
	FinishReason   string            `json:"finish_reason"`
	TokenIDs       []int64           `json:"token_ids,omitempty"`
	PromptTokenIDs []int64           `json:"prompt_token_ids,omitempty"`
	StopReason     *json.RawMessage  `json:"stop_reason"`
}

type wireTextLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error(), "")
		return
	}
	var req wireTokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "the body is not a tokenize request: "+err.Error(), "")
		return
	}
	s.tokenizeCalls.Add(1)
	var text string
	switch {
	case req.Prompt != nil:
		text = *req.Prompt
	case req.Messages != nil:
		msgs, tools := requestMessages(req.Messages, req.Tools)
		text = RenderChat(msgs, tools, req.AddGenerationPrompt)
	default:
		writeError(w, http.StatusBadRequest, "want prompt or messages", "")
		return
	}
	ids := Encode(text)
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": 1 << 20, "tokens": ids, "token_strs": nil})
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "the body is not a detokenize request: "+err.Error(), "")
		return
	}
	text, err := Decode(req.Tokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), "tokens")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": text})
}

func requestMessages(wms []wireMessage, wts []wireTool) ([]Message, []Tool) {
	msgs := make([]Message, len(wms))
	for i, m := range wms {
		msg := Message{Role: m.Role, Content: string(m.Content), ToolCallID: m.ToolCallID, Name: m.Name}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		msgs[i] = msg
	}
	var tools []Tool
	for _, t := range wts {
		tools = append(tools, Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	return msgs, tools
}

// completions is vLLM's /v1/completions with the prompt as token ids (or
// text): the prompt is decoded, read back into messages for the
// Responder, and the reply sampled as the bytes of its text (tool calls as
// Hermes markup) followed by <|im_end|>.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	n := s.calls.Add(1)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error(), "")
		return
	}
	var wr wireCompletionRequest
	if err := json.Unmarshal(body, &wr); err != nil {
		writeError(w, http.StatusBadRequest, "the request body is not a completions request: "+err.Error(), "")
		return
	}
	if wr.Stream {
		writeError(w, http.StatusBadRequest, "stream is not supported by the fake policy server", "stream")
		return
	}
	var promptIDs []int64
	var prompt string
	if json.Unmarshal(wr.Prompt, &promptIDs) == nil && promptIDs != nil {
		if prompt, err = Decode(promptIDs); err != nil {
			writeError(w, http.StatusBadRequest, "prompt: "+err.Error(), "prompt")
			return
		}
	} else if json.Unmarshal(wr.Prompt, &prompt) == nil {
		promptIDs = Encode(prompt)
	} else {
		writeError(w, http.StatusBadRequest, "prompt is neither token ids nor a string", "prompt")
		return
	}
	req := &Request{Model: wr.Model, Endpoint: "completions", Messages: ParsePrompt(prompt), PromptIDs: promptIDs, Prompt: prompt,
		Logprobs: wr.Logprobs != nil, ReturnTokensAsTokenIDs: wr.ReturnTokensAsTokenIDs, ReturnTokenIDs: wr.ReturnTokenIDs, Body: body}
	if s.cfg.Record {
		s.mu.Lock()
		s.requests = append(s.requests, req)
		s.mu.Unlock()
	}
	if d := s.delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	var fault Fault
	if s.cfg.Fault != nil {
		fault = s.cfg.Fault(n, req)
	}
	if fault.Status != 0 {
		writeError(w, fault.Status, fmt.Sprintf("injected failure %d on call %d", fault.Status, n), "")
		return
	}
	reply := s.cfg.Responder(req)
	text := reply.Content
	for i, tc := range reply.ToolCalls {
		if text != "" || i > 0 {
			text += "\n"
		}
		text += toolCallText(tc)
	}
	ids := append(Encode(text), TokIMEnd)
	finish := "stop"
	if wr.MaxTokens != nil && len(ids) > *wr.MaxTokens {
		ids, finish = ids[:*wr.MaxTokens], "length"
	}
	shown := ids
	if finish == "stop" {
		shown = ids[:len(ids)-1] // skip_special_tokens: the text leaves <|im_end|> out
	}
	outText, _ := Decode(shown)
	choice := wireCompletionChoice{Text: outText, FinishReason: finish}
	if wr.Logprobs != nil && !fault.OmitLogprobs {
		lp := &wireTextLogprobs{}
		off := 0
		for i, id := range ids {
			tok, _ := Decode([]int64{id})
			if wr.ReturnTokensAsTokenIDs {
				tok = "token_id:" + strconv.FormatInt(id, 10)
			}
			lp.Tokens = append(lp.Tokens, tok)
			lp.TokenLogprobs = append(lp.TokenLogprobs, tokenLogprob(len(promptIDs)+i, id))
			lp.TopLogprobs = append(lp.TopLogprobs, nil)
			lp.TextOffset = append(lp.TextOffset, off)
			off += len(tok)
		}
		choice.Logprobs = lp
	}
	if wr.ReturnTokenIDs {
		choice.TokenIDs = ids
		choice.PromptTokenIDs = promptIDs
		if fault.EchoWrongPrompt {
			choice.PromptTokenIDs = append([]int64{TokEndOfText}, promptIDs...)
		}
	}
	usage := &wireUsage{PromptTokens: len(promptIDs), CompletionTokens: len(ids), TotalTokens: len(promptIDs) + len(ids)}
	if fault.EchoWrongPrompt {
		usage.PromptTokens++
		usage.TotalTokens++
	}
	resp := map[string]any{"id": "cmpl-fake-" + strconv.FormatInt(s.ids.Add(1), 10), "object": "text_completion",
		"created": time.Now().Unix(), "model": s.cfg.Model, "choices": []wireCompletionChoice{choice}}
	if !s.cfg.OmitUsage {
		resp["usage"] = usage
	}
	writeJSON(w, http.StatusOK, resp)
}

// tokenLogprob is the deterministic log probability of sampling id at
// position pos.
func tokenLogprob(pos int, id int64) float64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d:%d", pos, id)
	return -float64(h.Sum32()%1000+1) / 1000
}

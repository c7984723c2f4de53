package fakepolicy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// ChoiceScript is a policy for tests written outside Go (the Python
// client's): for a conversation whose first user message contains Match,
// the server plays one of Choices, a list of assistant turns. Conversations
// of the same task take the choices in turn (the first conversation gets
// Choices[0], the next Choices[1], ...), so a GRPO group of as many
// episodes as choices holds each exactly once whatever order its turns
// arrive in. The choice is written into each reply's content ("[choice N]")
// and read back from the conversation on later turns, so the server keeps
// no per-episode state.
type ChoiceScript struct {
	Match   string         `json:"match"`
	Choices [][]ScriptTurn `json:"choices"`
}

// ScriptTurn is one assistant turn of a ChoiceScript. Arguments may be
// given as an object or as the raw text the model would write.
type ScriptTurn struct {
	Content   string `json:"content,omitempty"`
	ToolCalls []struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
	} `json:"tool_calls,omitempty"`
}

// ChoiceFile is the JSON document of `fakepolicyd --script`.
type ChoiceFile struct {
	Scripts []ChoiceScript `json:"scripts"`
}

var choiceRe = regexp.MustCompile(`\[choice (\d+)\]`)

// ParseChoiceFile reads and checks a ChoiceFile.
func ParseChoiceFile(data []byte) (*ChoiceFile, error) {
	var f ChoiceFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	for i, s := range f.Scripts {
		if s.Match == "" {
			return nil, fmt.Errorf("scripts[%d].match: required", i)
		}
		if len(s.Choices) == 0 {
			return nil, fmt.Errorf("scripts[%d].choices: at least one choice", i)
		}
		for j, c := range s.Choices {
			for k, t := range c {
				for l, tc := range t.ToolCalls {
					if tc.Name == "" {
						return nil, fmt.Errorf("scripts[%d].choices[%d][%d].tool_calls[%d].name: required", i, j, k, l)
					}
				}
			}
		}
	}
	return &f, nil
}

// Choices returns a Responder playing the file's scripts. A conversation
// no script matches is answered "ok" (no tool call).
func Choices(f *ChoiceFile) Responder {
	var mu sync.Mutex
	next := make([]int, len(f.Scripts))
	return func(req *Request) Reply {
		first, assistant := "", ""
		for _, m := range req.Messages {
			if m.Role == "user" && first == "" {
				first = m.Content
			}
			if m.Role == "assistant" && assistant == "" {
				assistant = m.Content
			}
		}
		si := -1
		for i, s := range f.Scripts {
			if strings.Contains(first, s.Match) {
				si = i
				break
			}
		}
		if si < 0 {
			return Reply{Content: "ok"}
		}
		s := f.Scripts[si]
		turn := req.AssistantTurns()
		choice := -1
		if turn == 0 {
			mu.Lock()
			choice = next[si] % len(s.Choices)
			next[si]++
			mu.Unlock()
		} else if m := choiceRe.FindStringSubmatch(assistant); m != nil {
			choice, _ = strconv.Atoi(m[1])
		}
		if choice < 0 || choice >= len(s.Choices) || turn >= len(s.Choices[choice]) {
			return Reply{Content: "done"}
		}
		t := s.Choices[choice][turn]
		r := Reply{Content: strings.TrimSpace(fmt.Sprintf("[choice %d] %s", choice, t.Content))}
		for _, tc := range t.ToolCalls {
			args, err := argumentsText(tc.Arguments)
			if err != nil {
				args = string(tc.Arguments)
			}
			r.ToolCalls = append(r.ToolCalls, ToolCall{Name: tc.Name, Arguments: args})
		}
		return r
	}
}

// argumentsText is a call's arguments as the text a model writes: a JSON
// string is unquoted, an object kept as is, nothing is "{}".
func argumentsText(raw json.RawMessage) (string, error) {
	s := strings.TrimSpace(string(raw))
	switch {
	case s == "" || s == "null":
		return "{}", nil
	case s[0] == '"':
		var text string
		err := json.Unmarshal(raw, &text)
		return text, err
	case s[0] == '{':
		return s, nil
	}
	return "", errors.New("arguments: want a JSON string or object")
}

package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// RedactionConfig is the redaction of imported episodes (rollbox serve
// --redact FILE): the default patterns (unless Defaults is false) and the
// operator's own.
type RedactionConfig struct {
	// Defaults turns the default patterns on (nil: on).
	Defaults *bool `json:"defaults,omitempty"`
	// Patterns are the operator's own, applied after the defaults.
	Patterns []RedactionPattern `json:"patterns,omitempty"`
}

// RedactionPattern is one user pattern: what it finds is replaced by
// [REDACTED:<kind>]. When the regular expression has a group named secret,
// only that group is replaced (e.g. `password=(?P<secret>\S+)`).
type RedactionPattern struct {
	Kind  string `json:"kind"`
	Regex string `json:"regex"`
}

// DefaultRedactionPatterns are the patterns redacted by default, by kind,
// in the order they are applied (docs/production.md lists them).
func DefaultRedactionPatterns() []RedactionPattern {
	return []RedactionPattern{
		{"private_key", `-----BEGIN [A-Z ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z ]*PRIVATE KEY-----|$)`},
		{"url_credentials", `[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:(?P<secret>[^\s@/]+)@`},
		{"bearer_token", `(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)`},
		{"jwt", `\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`},
		{"api_key", `\b(?:sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|glpat-[A-Za-z0-9_-]{20,})`},
		{"email", `[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}`},
	}
}

// defaultHints are substrings without which a default pattern cannot
// match: a string holding none of them is not scanned by that pattern.
var defaultHints = map[string][]string{
	"private_key":     {"PRIVATE KEY-----"},
	"url_credentials": {"://"},
	"bearer_token":    {"bearer"}, // compared case-folded (foldedHints)
	"jwt":             {"eyJ"},
	"api_key":         {"sk-", "AKIA", "hp_", "ho_", "hu_", "hs_", "hr_", "github_pat_", "xox", "AIza", "glpat-"},
	"email":           {"@"},
}

// foldedHints are the kinds whose hints are compared without case.
var foldedHints = map[string]bool{"bearer_token": true}

var redactKindRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Redactor replaces secrets in text.
type Redactor struct {
	rules []redactRule
}

type redactRule struct {
	kind   string
	re     *regexp.Regexp
	secret int // the index of the group named secret, or 0 for the whole match
	hints  []string
	fold   bool // compare hints with the text lower-cased
	repl   string
}

// NewRedactor compiles a configuration. Errors name the pattern.
func NewRedactor(c RedactionConfig) (*Redactor, error) {
	var pats []RedactionPattern
	if c.Defaults == nil || *c.Defaults {
		pats = DefaultRedactionPatterns()
	}
	r := &Redactor{}
	for i, p := range append(pats, c.Patterns...) {
		user := i >= len(pats)
		if !redactKindRe.MatchString(p.Kind) {
			return nil, fmt.Errorf("patterns[%d].kind %q: use lower-case letters, digits and _ (at most 32)", i-len(pats), p.Kind)
		}
		re, err := regexp.Compile(p.Regex)
		if err != nil {
			return nil, fmt.Errorf("patterns[%d].regex: %v", i-len(pats), err)
		}
		if re.MatchString("") {
			return nil, fmt.Errorf("patterns[%d].regex %q matches the empty string", i-len(pats), p.Regex)
		}
		rule := redactRule{kind: p.Kind, re: re, secret: re.SubexpIndex("secret"), repl: "[REDACTED:" + p.Kind + "]"}
		if rule.secret < 0 {
			rule.secret = 0
		}
		if !user {
			rule.hints, rule.fold = defaultHints[p.Kind], foldedHints[p.Kind]
		}
		r.rules = append(r.rules, rule)
	}
	return r, nil
}

// LoadRedaction reads a redaction configuration file (JSON).
func LoadRedaction(path string) (*Redactor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c RedactionConfig
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	r, err := NewRedactor(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return r, nil
}

// Kinds lists the kinds the redactor finds, in order.
func (r *Redactor) Kinds() []string {
	var out []string
	for _, rule := range r.rules {
		out = append(out, rule.kind)
	}
	return out
}

// String redacts s; hit is called with each kind found and how many times.
func (r *Redactor) String(s string, hit func(kind string, n int)) string {
	if r == nil {
		return s
	}
	for i := range r.rules {
		rule := &r.rules[i]
		if !rule.hinted(s) {
			continue
		}
		locs := rule.re.FindAllStringSubmatchIndex(s, -1)
		if len(locs) == 0 {
			continue
		}
		var b strings.Builder
		last, n := 0, 0
		for _, loc := range locs {
			from, to := loc[2*rule.secret], loc[2*rule.secret+1]
			if from < 0 || from < last {
				continue
			}
			b.WriteString(s[last:from])
			b.WriteString(rule.repl)
			last = to
			n++
		}
		if n == 0 {
			continue
		}
		b.WriteString(s[last:])
		s = b.String()
		hit(rule.kind, n)
	}
	return s
}

// mayMatch reports whether some string of a JSON document could hold what
// a pattern finds: false only when every pattern has hints, none of them is
// in raw, and raw has no escape that could hide one (\u, \/).
func (r *Redactor) mayMatch(raw []byte) bool {
	if r == nil {
		return false
	}
	if bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`)) {
		return true
	}
	var lower []byte
	for i := range r.rules {
		rule := &r.rules[i]
		if len(rule.hints) == 0 {
			return true
		}
		text := raw
		if rule.fold {
			if lower == nil {
				lower = bytes.ToLower(raw)
			}
			text = lower
		}
		for _, h := range rule.hints {
			if bytes.Contains(text, []byte(h)) {
				return true
			}
		}
	}
	return false
}

// hinted reports whether s holds one of the rule's hints (always, for a
// rule without hints).
func (rule *redactRule) hinted(s string) bool {
	if len(rule.hints) == 0 {
		return true
	}
	if rule.fold {
		s = strings.ToLower(s)
	}
	return containsAny(s, rule.hints)
}

// Finds returns the kind of the first pattern that matches s, or "".
func (r *Redactor) Finds(s string) string {
	if r == nil {
		return ""
	}
	for i := range r.rules {
		rule := &r.rules[i]
		if !rule.hinted(s) {
			continue
		}
		if rule.re.MatchString(s) {
			return rule.kind
		}
	}
	return ""
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// unredactedKeys are the object keys whose values are identifiers or
// structure, never redacted (ids are checked instead: an id holding a
// secret refuses the line, since ids are stored as given).
var unredactedKeys = map[string]bool{
	"id": true, "role": true, "type": true, "tool_call_id": true, "call_id": true, "episode_id": true,
	"rollout_id": true, "group_id": true, "task_id": true, "task_hash": true, "schema": true, "format": true,
	"started_at": true, "ended_at": true, "at": true, "policy_version": true, "model": true, "finish_reason": true,
	"kind": true, "reason": true, "error_kind": true, "segment_reason": true, "tokens": true, "backend": true,
	"image_digest": true, "created": true,
}

// redactValue redacts every string of a decoded JSON value in place (but
// those under unredactedKeys), recording each kind found at each path.
func (r *Redactor) redactValue(v any, path []string, out *[]trajectory.Redaction) any {
	switch x := v.(type) {
	case string:
		return r.String(x, func(kind string, n int) {
			*out = append(*out, trajectory.Redaction{Kind: kind, Path: joinPath(path), Count: n})
		})
	case []any:
		for i := range x {
			x[i] = r.redactValue(x[i], append(path, "["+strconv.Itoa(i)+"]"), out)
		}
	case map[string]any:
		for k, e := range x {
			if unredactedKeys[k] {
				if _, isString := e.(string); isString {
					continue
				}
			}
			x[k] = r.redactValue(e, append(path, k), out)
		}
	}
	return v
}

func joinPath(p []string) string {
	var b strings.Builder
	for i, e := range p {
		if i > 0 && !strings.HasPrefix(e, "[") {
			b.WriteByte('.')
		}
		b.WriteString(e)
	}
	return b.String()
}

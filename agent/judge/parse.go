package judge

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Parsed is a judge's answer read: the score as given (Raw: a number or a
// label), its value on the scale, normalised to 0..1, and the reason.
type Parsed struct {
	Raw    string
	Value  float64
	Score  float64
	Reason string
	// How is "json" or "text".
	How string
}

// Ways a score was found.
const (
	ParsedJSON = "json"
	ParsedText = "text"
)

// ErrNoScore is an answer without a score on the rubric's scale.
var ErrNoScore = errors.New("no score on the rubric's scale")

// maxReason bounds a reason kept from free text.
const maxReason = 1000

// Parse reads a judge's answer to rubric (name) on scale: a JSON object
// ({"score": 7, "reason": "..."}, the score as a number, a numeric string,
// "7/10" or a label; also nested under the rubric's name or "scores"),
// anywhere in the text (code fences, prose around it); else text such as
// "Score: 7/10", "Rating = 8 out of 10", "Verdict: good", the last one
// winning. A reasoning model's <think> block is ignored. A score off the
// scale is not a score.
func Parse(text, rubric string, scale Scale) (Parsed, error) {
	body := stripThink(text)
	var firstErr error
	objs := jsonObjects(body)
	for i := len(objs) - 1; i >= 0; i-- {
		p, ok, err := fromObject(objs[i], rubric, scale)
		if ok {
			p.How = ParsedJSON
			return p, nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if p, ok, err := fromText(body, scale); ok {
		p.How = ParsedText
		return p, nil
	} else if err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return Parsed{}, firstErr
	}
	return Parsed{}, ErrNoScore
}

var thinkRe = regexp.MustCompile(`(?s)<think>.*?</think>`)

// stripThink drops reasoning blocks: closed ones, and an answer that
// opens with one never closed keeps only what follows "</think>" if any.
func stripThink(s string) string {
	s = thinkRe.ReplaceAllString(s, "")
	if i := strings.LastIndex(s, "</think>"); i >= 0 {
		s = s[i+len("</think>"):]
	}
	return s
}

// jsonObjects finds the JSON objects in s, outermost ones, in order.
func jsonObjects(s string) []map[string]any {
	var out []map[string]any
	for i := 0; i < len(s); i++ {
		if s[i] != '{' {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(s[i:]))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			continue
		}
		out = append(out, m)
		i += int(dec.InputOffset()) - 1
	}
	return out
}

var scoreKeys = []string{"score", "rating", "grade", "value", "label", "verdict", "result"}
var reasonKeys = []string{"reason", "reasoning", "rationale", "explanation", "justification", "comment", "feedback"}

// fromObject reads a score from a JSON object: its own score key, or one
// nested under the rubric's name or under "scores" (one entry, or the
// rubric's).
func fromObject(m map[string]any, rubric string, scale Scale) (Parsed, bool, error) {
	lower := make(map[string]any, len(m))
	for k, v := range m {
		lower[strings.ToLower(strings.TrimSpace(k))] = v
	}
	reason := ""
	for _, k := range reasonKeys {
		if v, ok := lower[k].(string); ok {
			reason = v
			break
		}
	}
	var firstErr error
	for _, k := range scoreKeys {
		v, ok := lower[k]
		if !ok {
			continue
		}
		p, ok, err := fromValue(v, scale)
		if ok {
			p.Reason = reason
			return p, true, nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, k := range []string{strings.ToLower(rubric), "scores", "rubrics", "evaluation"} {
		switch v := lower[k].(type) {
		case map[string]any:
			if k != strings.ToLower(rubric) && len(v) > 1 {
				if inner, ok := v[rubric]; ok {
					if p, ok, err := nested(inner, rubric, scale, reason); ok || err != nil {
						return p, ok, err
					}
				}
				continue
			}
			if k != strings.ToLower(rubric) {
				for _, inner := range v {
					if p, ok, err := nested(inner, rubric, scale, reason); ok || err != nil {
						return p, ok, err
					}
				}
				continue
			}
			if p, ok, err := nested(v, rubric, scale, reason); ok || err != nil {
				return p, ok, err
			}
		case nil:
		default:
			if k == strings.ToLower(rubric) {
				if p, ok, err := nested(v, rubric, scale, reason); ok || err != nil {
					return p, ok, err
				}
			}
		}
	}
	return Parsed{}, false, firstErr
}

func nested(v any, rubric string, scale Scale, reason string) (Parsed, bool, error) {
	if m, ok := v.(map[string]any); ok {
		p, ok, err := fromObject(m, rubric, scale)
		if ok && p.Reason == "" {
			p.Reason = reason
		}
		return p, ok, err
	}
	p, ok, err := fromValue(v, scale)
	if ok {
		p.Reason = reason
	}
	return p, ok, err
}

// fromValue reads a score value: a number, a numeric string ("7",
// "7/10", "7 out of 10") or a label.
func fromValue(v any, scale Scale) (Parsed, bool, error) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return Parsed{}, false, nil
		}
		return onScale(x.String(), f, 0, scale)
	case float64:
		return onScale(strconv.FormatFloat(x, 'g', -1, 64), x, 0, scale)
	case string:
		s := strings.TrimSpace(x)
		if l, ok := label(s, scale); ok {
			return Parsed{Raw: l.Label, Value: l.Value, Score: scale.Normalize(l.Value)}, true, nil
		}
		if m := fractionRe.FindStringSubmatch(s); m != nil && strings.TrimSpace(fractionRe.ReplaceAllString(s, "")) == "" {
			return fraction(m, scale)
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return onScale(s, f, 0, scale)
		}
	}
	return Parsed{}, false, nil
}

// fractionRe is "7", "7/10", "7 / 10" or "7 out of 10".
var fractionRe = regexp.MustCompile(`(?i)([-+]?\d+(?:\.\d+)?)\s*(?:(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?`)

func fraction(m []string, scale Scale) (Parsed, bool, error) {
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return Parsed{}, false, nil
	}
	var denom float64
	if m[2] != "" {
		denom, _ = strconv.ParseFloat(m[2], 64)
	}
	raw := m[1]
	if denom != 0 {
		raw += "/" + m[2]
	}
	return onScale(raw, f, denom, scale)
}

// onScale checks a numeric score against the scale. A denominator ("/10")
// must be the scale's maximum; a labelled scale takes a number only when
// it is one of its values.
func onScale(raw string, v, denom float64, scale Scale) (Parsed, bool, error) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return Parsed{}, false, nil
	}
	if len(scale.Labels) > 0 {
		for _, l := range scale.Labels {
			if l.Value == v {
				return Parsed{Raw: raw, Value: v, Score: scale.Normalize(v)}, true, nil
			}
		}
		return Parsed{}, false, fmt.Errorf("score %s is not a value of the scale (%s)", raw, scale.describe())
	}
	if denom != 0 && denom != scale.Max {
		return Parsed{}, false, fmt.Errorf("score %s is not on the scale %s..%s", raw, fmtNum(scale.Min), fmtNum(scale.Max))
	}
	if v < scale.Min || v > scale.Max {
		return Parsed{}, false, fmt.Errorf("score %s is outside the scale %s..%s", raw, fmtNum(scale.Min), fmtNum(scale.Max))
	}
	return Parsed{Raw: raw, Value: v, Score: scale.Normalize(v)}, true, nil
}

// label finds a scale label (case and surrounding punctuation ignored).
func label(s string, scale Scale) (Label, bool) {
	k := strings.ToLower(strings.Trim(strings.TrimSpace(s), `"'*.!`+"`"))
	for _, l := range scale.Labels {
		if strings.ToLower(strings.TrimSpace(l.Label)) == k {
			return l, true
		}
	}
	return Label{}, false
}

// scoreLineRe finds "Score: 7/10", "**Rating**: 8 out of 10", "grade = 4",
// "Verdict: good" in text.
var scoreLineRe = regexp.MustCompile(`(?im)\b(?:final\s+)?(?:score|rating|grade|verdict|label)\b[*_\s]*[:=][*_\s]*("?[^\n"]{1,60}"?)`)

// bareFractionRe is "7/10" anywhere.
var bareFractionRe = regexp.MustCompile(`([-+]?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)`)

var reasonLineRe = regexp.MustCompile(`(?im)^[*_\s]*(?:reason|reasoning|rationale|explanation|justification)[*_\s]*[:=]\s*(.+)$`)

// fromText reads a score from free text: the last "Score: ..." line, else
// the last "N/MAX".
func fromText(s string, scale Scale) (Parsed, bool, error) {
	var firstErr error
	lines := scoreLineRe.FindAllStringSubmatch(s, -1)
	for i := len(lines) - 1; i >= 0; i-- {
		v := strings.TrimSpace(strings.Trim(strings.TrimSpace(lines[i][1]), `"*_`))
		if l, ok := label(v, scale); ok {
			return withReason(Parsed{Raw: l.Label, Value: l.Value, Score: scale.Normalize(l.Value)}, s), true, nil
		}
		if len(scale.Labels) > 0 {
			// "Verdict: good, because ..." — the first word
			if f := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' || r == ';' || r == '(' }); len(f) > 0 {
				if l, ok := label(f[0], scale); ok {
					return withReason(Parsed{Raw: l.Label, Value: l.Value, Score: scale.Normalize(l.Value)}, s), true, nil
				}
			}
		}
		if m := fractionRe.FindStringSubmatch(v); m != nil && strings.Index(v, m[0]) == 0 {
			p, ok, err := fraction(m, scale)
			if ok {
				return withReason(p, s), true, nil
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	if len(scale.Labels) == 0 {
		fr := bareFractionRe.FindAllStringSubmatch(s, -1)
		for i := len(fr) - 1; i >= 0; i-- {
			if d, _ := strconv.ParseFloat(fr[i][2], 64); d != scale.Max {
				continue
			}
			p, ok, err := fraction(fr[i], scale)
			if ok {
				return withReason(p, s), true, nil
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	return Parsed{}, false, firstErr
}

// withReason takes the reason from a "Reason: ..." line, else the text.
func withReason(p Parsed, s string) Parsed {
	if m := reasonLineRe.FindStringSubmatch(s); m != nil {
		p.Reason = strings.TrimSpace(m[1])
	} else {
		p.Reason = strings.TrimSpace(s)
	}
	if len(p.Reason) > maxReason {
		p.Reason = strings.ToValidUTF8(p.Reason[:maxReason], "") + "…"
	}
	return p
}

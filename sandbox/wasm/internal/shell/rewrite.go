package shell

import (
	"context"
	"regexp"
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/pattern"
	"mvdan.cc/sh/v3/syntax"
)

// The expansion package differs from bash in a few places; these are done
// here, before it sees the word:
//   - anchored replacements ${x/#pat/rep} and ${x/%pat/rep} (it takes the
//     # or % as part of the pattern);
//   - defaults and alternates of the positional parameters, ${@:-w},
//     "${@:+w}" (it applies them per element);
//   - field splitting with an IFS holding non-whitespace characters, where
//     each such character delimits a field, empty ones included (it merges
//     adjacent delimiters), for words that are one unquoted expansion.

// rewrite returns w, or a copy in which the constructs above are resolved.
func (sh *shell) rewrite(ctx context.Context, w *syntax.Word) (*syntax.Word, error) {
	if w == nil || !needsRewrite(w.Parts) {
		return w, nil
	}
	parts, err := sh.rewriteParts(ctx, w.Parts, false)
	if err != nil {
		return nil, err
	}
	return &syntax.Word{Parts: parts}, nil
}

func needsRewrite(parts []syntax.WordPart) bool {
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.DblQuoted:
			if needsRewrite(p.Parts) {
				return true
			}
		case *syntax.ParamExp:
			if anchored(p) || positionalDefault(p) {
				return true
			}
		}
	}
	return false
}

func anchored(p *syntax.ParamExp) bool {
	if p.Repl == nil || p.Repl.Orig == nil || len(p.Repl.Orig.Parts) == 0 {
		return false
	}
	l, ok := p.Repl.Orig.Parts[0].(*syntax.Lit)
	return ok && (strings.HasPrefix(l.Value, "#") || strings.HasPrefix(l.Value, "%"))
}

func positionalDefault(p *syntax.ParamExp) bool {
	if p.Param == nil || p.Exp == nil || p.Index != nil || p.Excl || p.Length {
		return false
	}
	switch p.Param.Value {
	case "@", "*":
	default:
		return false
	}
	switch p.Exp.Op {
	case syntax.DefaultUnset, syntax.DefaultUnsetOrNull, syntax.AlternateUnset, syntax.AlternateUnsetOrNull:
		return true
	}
	return false
}

func (sh *shell) rewriteParts(ctx context.Context, parts []syntax.WordPart, quoted bool) ([]syntax.WordPart, error) {
	var out []syntax.WordPart
	for _, p := range parts {
		switch p := p.(type) {
		case *syntax.DblQuoted:
			inner, err := sh.rewriteParts(ctx, p.Parts, true)
			if err != nil {
				return nil, err
			}
			cp := *p
			cp.Parts = inner
			out = append(out, &cp)
		case *syntax.ParamExp:
			switch {
			case anchored(p):
				s, err := sh.anchoredReplace(ctx, p)
				if err != nil {
					return nil, err
				}
				out = append(out, &syntax.SglQuoted{Value: s})
			case positionalDefault(p):
				empty := len(sh.params) == 0
				if p.Exp.Op == syntax.DefaultUnsetOrNull || p.Exp.Op == syntax.AlternateUnsetOrNull {
					empty = empty || strings.Join(sh.params, "") == ""
				}
				useWord := empty
				if p.Exp.Op == syntax.AlternateUnset || p.Exp.Op == syntax.AlternateUnsetOrNull {
					useWord = !empty
				}
				switch {
				case useWord && p.Exp.Word != nil:
					out = append(out, p.Exp.Word.Parts...)
				case useWord:
				case p.Exp.Op == syntax.AlternateUnset || p.Exp.Op == syntax.AlternateUnsetOrNull:
				default:
					cp := *p
					cp.Exp = nil
					out = append(out, &cp)
				}
			default:
				out = append(out, p)
			}
		default:
			out = append(out, p)
		}
	}
	return out, nil
}

// anchoredReplace evaluates ${x/#pat/rep} or ${x/%pat/rep}.
func (sh *shell) anchoredReplace(ctx context.Context, p *syntax.ParamExp) (string, error) {
	plain := *p
	plain.Repl = nil
	val, release, err := sh.literal(ctx, &syntax.Word{Parts: []syntax.WordPart{&syntax.DblQuoted{Parts: []syntax.WordPart{&plain}}}})
	if err != nil {
		return "", err
	}
	defer release()
	orig := *p.Repl.Orig
	first := *(orig.Parts[0].(*syntax.Lit))
	atEnd := first.Value[0] == '%'
	first.Value = first.Value[1:]
	orig.Parts = append([]syntax.WordPart{&first}, orig.Parts[1:]...)
	pat, prel, err := sh.pattern(ctx, &orig)
	if err != nil {
		return "", err
	}
	defer prel()
	with, wrel, err := sh.literal(ctx, p.Repl.With)
	if err != nil {
		return "", err
	}
	defer wrel()
	expr, err := pattern.Regexp(pat, 0)
	if err != nil {
		return val, nil
	}
	if atEnd {
		expr = "(?s)(?:" + expr + ")$"
	} else {
		expr = "(?s)^(?:" + expr + ")"
	}
	rx, err := regexp.Compile(expr)
	if err != nil {
		return val, nil
	}
	loc := rx.FindStringIndex(val)
	if loc == nil {
		return val, nil
	}
	if atEnd {
		// The longest suffix: the leftmost start that still matches.
		for start := 0; start <= len(val); start++ {
			if l := rx.FindStringIndex(val[start:]); l != nil && l[0] == 0 {
				return val[:start] + with, nil
			}
		}
	}
	return with + val[loc[1]:], nil
}

// singleExpansion reports a word that is exactly one unquoted parameter
// expansion or command substitution: its fields come from IFS splitting.
func singleExpansion(w *syntax.Word) bool {
	if len(w.Parts) != 1 {
		return false
	}
	switch w.Parts[0].(type) {
	case *syntax.ParamExp, *syntax.CmdSubst:
		return true
	}
	return false
}

// ifsHasNonSpace reports whether IFS holds a delimiter other than
// whitespace.
func (sh *shell) ifsHasNonSpace() (string, bool) {
	vr := sh.vars.get("IFS")
	if !vr.IsSet() {
		return " \t\n", false
	}
	return vr.Str, strings.Trim(vr.Str, " \t\n") != ""
}

// splitIFS splits s as POSIX field splitting does: IFS whitespace runs
// and leading/trailing whitespace delimit nothing extra; every other IFS
// character ends a field, so adjacent ones make empty fields; a final
// non-whitespace delimiter makes no trailing empty field.
func splitIFS(s, ifs string) []string {
	isWS := func(c byte) bool { return (c == ' ' || c == '\t' || c == '\n') && strings.IndexByte(ifs, c) >= 0 }
	isDelim := func(c byte) bool { return strings.IndexByte(ifs, c) >= 0 }
	var out []string
	i := 0
	for i < len(s) && isWS(s[i]) {
		i++
	}
	start := i
	for i < len(s) {
		c := s[i]
		if !isDelim(c) {
			i++
			continue
		}
		out = append(out, s[start:i])
		// Consume whitespace, at most one non-whitespace delimiter, then
		// whitespace again.
		for i < len(s) && isWS(s[i]) {
			i++
		}
		if !isWS(c) {
			i++ // the delimiter itself
		} else if i < len(s) && isDelim(s[i]) && !isWS(s[i]) {
			i++
		}
		for i < len(s) && isWS(s[i]) {
			i++
		}
		start = i
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// splitWord expands a single-expansion word with our own field splitting
// (IFS with non-whitespace delimiters), then globs each field.
func (sh *shell) splitWord(ctx context.Context, t *transient, w *syntax.Word, ifs string, yield func(string) error) error {
	quoted := &syntax.Word{Parts: []syntax.WordPart{&syntax.DblQuoted{Parts: w.Parts}}}
	s, err := expand.Literal(sh.config(ctx, t), quoted)
	if err != nil {
		return err
	}
	for _, f := range splitIFS(s, ifs) {
		if sh.opts.noglob || f == "" || !pattern.HasMeta(f, 0) {
			if err := yield(f); err != nil {
				return err
			}
			continue
		}
		lit := &syntax.Word{Parts: []syntax.WordPart{&syntax.Lit{Value: escapeForGlob(f)}}}
		for g, err := range expand.FieldsSeq(sh.config(ctx, t), lit) {
			if err != nil {
				return err
			}
			if err := yield(g); err != nil {
				return err
			}
		}
	}
	return nil
}

// escapeForGlob escapes what a literal word would give meaning besides the
// glob characters (braces, tilde, quotes, $, backslash).
func escapeForGlob(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '{', '}', '~', '\\', '$', '`', '"', '\'', ',', ' ', '\t', '\n':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/go-python/gpython/py"
)

// addMethods fills in common methods gpython 0.2.0's str, list and dict
// lack (it has only split, strip, replace, find, startswith and endswith for
// str; append, extend and sort for list; keys, values, items and get for
// dict), by adding them to the types' method tables at start-up.
func addMethods() {
	str := func(name string, fn func(s string, args py.Tuple) (py.Object, error)) {
		py.StringType.Dict[name] = py.MustNewMethod(name, func(self py.Object, args py.Tuple) (py.Object, error) {
			return fn(string(self.(py.String)), args)
		}, 0, "")
	}
	strArg := func(args py.Tuple, i int, def string) string {
		if i < len(args) {
			if s, ok := args[i].(py.String); ok {
				return string(s)
			}
		}
		return def
	}
	intArg := func(args py.Tuple, i int, def int) int {
		if i < len(args) {
			if n, ok := args[i].(py.Int); ok {
				return int(n)
			}
		}
		return def
	}
	str("join", func(s string, args py.Tuple) (py.Object, error) {
		if len(args) != 1 {
			return nil, py.ExceptionNewf(py.TypeError, "join() takes exactly one argument")
		}
		var parts []string
		err := py.Iterate(args[0], func(o py.Object) bool {
			parts = append(parts, string(asString(o)))
			return false
		})
		if err != nil {
			return nil, err
		}
		return py.String(strings.Join(parts, s)), nil
	})
	str("upper", func(s string, _ py.Tuple) (py.Object, error) { return py.String(strings.ToUpper(s)), nil })
	str("lower", func(s string, _ py.Tuple) (py.Object, error) { return py.String(strings.ToLower(s)), nil })
	str("title", func(s string, _ py.Tuple) (py.Object, error) {
		prev := ' '
		return py.String(strings.Map(func(r rune) rune {
			defer func() { prev = r }()
			if !unicode.IsLetter(prev) {
				return unicode.ToUpper(r)
			}
			return unicode.ToLower(r)
		}, s)), nil
	})
	str("capitalize", func(s string, _ py.Tuple) (py.Object, error) {
		if s == "" {
			return py.String(""), nil
		}
		rs := []rune(strings.ToLower(s))
		rs[0] = unicode.ToUpper(rs[0])
		return py.String(string(rs)), nil
	})
	str("count", func(s string, args py.Tuple) (py.Object, error) {
		return py.Int(strings.Count(s, strArg(args, 0, ""))), nil
	})
	str("index", func(s string, args py.Tuple) (py.Object, error) {
		i := strings.Index(s, strArg(args, 0, ""))
		if i < 0 {
			return nil, py.ExceptionNewf(py.ValueError, "substring not found")
		}
		return py.Int(len([]rune(s[:i]))), nil
	})
	is := func(name string, pred func(rune) bool) {
		str(name, func(s string, _ py.Tuple) (py.Object, error) {
			if s == "" {
				return py.False, nil
			}
			for _, r := range s {
				if !pred(r) {
					return py.False, nil
				}
			}
			return py.True, nil
		})
	}
	is("isdigit", unicode.IsDigit)
	is("isnumeric", unicode.IsNumber)
	is("isalpha", unicode.IsLetter)
	is("isalnum", func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) })
	is("isspace", unicode.IsSpace)
	is("isupper", func(r rune) bool { return !unicode.IsLetter(r) || unicode.IsUpper(r) })
	is("islower", func(r rune) bool { return !unicode.IsLetter(r) || unicode.IsLower(r) })
	pad := func(name string, f func(s string, n int, fill string) string) {
		str(name, func(s string, args py.Tuple) (py.Object, error) {
			n := intArg(args, 0, 0)
			fill := strArg(args, 1, " ")
			if k := len([]rune(s)); k < n {
				return py.String(f(s, n-k, fill)), nil
			}
			return py.String(s), nil
		})
	}
	pad("ljust", func(s string, n int, fill string) string { return s + strings.Repeat(fill, n) })
	pad("rjust", func(s string, n int, fill string) string { return strings.Repeat(fill, n) + s })
	pad("center", func(s string, n int, fill string) string {
		return strings.Repeat(fill, n/2) + s + strings.Repeat(fill, n-n/2)
	})
	pad("zfill", func(s string, n int, _ string) string { return strings.Repeat("0", n) + s })
	str("splitlines", func(s string, _ py.Tuple) (py.Object, error) {
		lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
		if s == "" {
			lines = nil
		}
		return py.NewListFromStrings(lines), nil
	})
	str("partition", func(s string, args py.Tuple) (py.Object, error) {
		sep := strArg(args, 0, "")
		a, b, ok := strings.Cut(s, sep)
		if !ok {
			return py.Tuple{py.String(s), py.String(""), py.String("")}, nil
		}
		return py.Tuple{py.String(a), py.String(sep), py.String(b)}, nil
	})
	str("format", func(s string, args py.Tuple) (py.Object, error) {
		out, err := format(s, args)
		if err != nil {
			return nil, err
		}
		return py.String(out), nil
	})

	list := func(name string, fn func(l *py.List, args py.Tuple) (py.Object, error)) {
		py.ListType.Dict[name] = py.MustNewMethod(name, func(self py.Object, args py.Tuple) (py.Object, error) {
			return fn(self.(*py.List), args)
		}, 0, "")
	}
	find := func(l *py.List, x py.Object) (int, error) {
		for i, it := range l.Items {
			eq, err := py.Eq(it, x)
			if err != nil {
				return -1, err
			}
			if eq == py.True {
				return i, nil
			}
		}
		return -1, nil
	}
	list("pop", func(l *py.List, args py.Tuple) (py.Object, error) {
		if len(l.Items) == 0 {
			return nil, py.ExceptionNewf(py.IndexError, "pop from empty list")
		}
		i := intArg(args, 0, -1)
		if i < 0 {
			i += len(l.Items)
		}
		if i < 0 || i >= len(l.Items) {
			return nil, py.ExceptionNewf(py.IndexError, "pop index out of range")
		}
		v := l.Items[i]
		l.Items = append(l.Items[:i], l.Items[i+1:]...)
		return v, nil
	})
	list("insert", func(l *py.List, args py.Tuple) (py.Object, error) {
		if len(args) != 2 {
			return nil, py.ExceptionNewf(py.TypeError, "insert expected 2 arguments")
		}
		i := max(0, min(intArg(args, 0, 0), len(l.Items)))
		l.Items = append(l.Items[:i], append([]py.Object{args[1]}, l.Items[i:]...)...)
		return py.None, nil
	})
	list("remove", func(l *py.List, args py.Tuple) (py.Object, error) {
		i, err := find(l, args[0])
		if err != nil || i < 0 {
			return nil, py.ExceptionNewf(py.ValueError, "list.remove(x): x not in list")
		}
		l.Items = append(l.Items[:i], l.Items[i+1:]...)
		return py.None, nil
	})
	list("index", func(l *py.List, args py.Tuple) (py.Object, error) {
		i, err := find(l, args[0])
		if err != nil || i < 0 {
			return nil, py.ExceptionNewf(py.ValueError, "x not in list")
		}
		return py.Int(i), nil
	})
	list("count", func(l *py.List, args py.Tuple) (py.Object, error) {
		n := 0
		for _, it := range l.Items {
			if eq, _ := py.Eq(it, args[0]); eq == py.True {
				n++
			}
		}
		return py.Int(n), nil
	})
	list("reverse", func(l *py.List, _ py.Tuple) (py.Object, error) {
		for i, j := 0, len(l.Items)-1; i < j; i, j = i+1, j-1 {
			l.Items[i], l.Items[j] = l.Items[j], l.Items[i]
		}
		return py.None, nil
	})
	list("copy", func(l *py.List, _ py.Tuple) (py.Object, error) {
		return py.NewListFromItems(append([]py.Object(nil), l.Items...)), nil
	})
	list("clear", func(l *py.List, _ py.Tuple) (py.Object, error) {
		l.Items = nil
		return py.None, nil
	})

	dict := func(name string, fn func(d py.StringDict, args py.Tuple) (py.Object, error)) {
		py.StringDictType.Dict[name] = py.MustNewMethod(name, func(self py.Object, args py.Tuple) (py.Object, error) {
			return fn(self.(py.StringDict), args)
		}, 0, "")
	}
	dict("pop", func(d py.StringDict, args py.Tuple) (py.Object, error) {
		k := strArg(args, 0, "")
		v, ok := d[k]
		if !ok {
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, py.ExceptionNewf(py.KeyError, "%q", k)
		}
		delete(d, k)
		return v, nil
	})
	dict("setdefault", func(d py.StringDict, args py.Tuple) (py.Object, error) {
		k := strArg(args, 0, "")
		if v, ok := d[k]; ok {
			return v, nil
		}
		var v py.Object = py.None
		if len(args) > 1 {
			v = args[1]
		}
		d[k] = v
		return v, nil
	})
	dict("update", func(d py.StringDict, args py.Tuple) (py.Object, error) {
		if len(args) > 0 {
			if o, ok := args[0].(py.StringDict); ok {
				for k, v := range o {
					d[k] = v
				}
			}
		}
		return py.None, nil
	})
	dict("copy", func(d py.StringDict, _ py.Tuple) (py.Object, error) { return d.Copy(), nil })
	dict("clear", func(d py.StringDict, _ py.Tuple) (py.Object, error) {
		clear(d)
		return py.None, nil
	})
}

func asString(o py.Object) py.String {
	if s, ok := o.(py.String); ok {
		return s
	}
	if s, err := py.Str(o); err == nil {
		if ps, ok := s.(py.String); ok {
			return ps
		}
	}
	return py.String(fmt.Sprint(o))
}

// format implements str.format for {}, {0} and {name} fields with an
// optional spec such as :>5, :<5, :^5, :.2f, :d or :05d.
func format(s string, args py.Tuple) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch == '{' && i+1 < len(s) && s[i+1] == '{' || ch == '}' && i+1 < len(s) && s[i+1] == '}' {
			b.WriteByte(ch)
			i++
			continue
		}
		if ch != '{' {
			b.WriteByte(ch)
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", py.ExceptionNewf(py.ValueError, "Single '{' encountered in format string")
		}
		field := s[i+1 : i+end]
		i += end
		name, spec, _ := strings.Cut(field, ":")
		var v py.Object
		switch n, err := strconv.Atoi(name); {
		case name == "":
			if auto >= len(args) {
				return "", py.ExceptionNewf(py.IndexError, "tuple index out of range")
			}
			v = args[auto]
			auto++
		case err == nil:
			if n >= len(args) {
				return "", py.ExceptionNewf(py.IndexError, "tuple index out of range")
			}
			v = args[n]
		default:
			return "", py.ExceptionNewf(py.KeyError, "%q (keyword fields are not supported by this Python)", name)
		}
		b.WriteString(formatSpec(v, spec))
	}
	return b.String(), nil
}

func formatSpec(v py.Object, spec string) string {
	if spec == "" {
		return string(asString(v))
	}
	align := byte(0)
	if len(spec) > 0 && strings.IndexByte("<>^", spec[0]) >= 0 {
		align, spec = spec[0], spec[1:]
	}
	zero := strings.HasPrefix(spec, "0")
	kind := byte('s')
	if n := len(spec); n > 0 && strings.IndexByte("dfsxeg%", spec[n-1]) >= 0 {
		kind, spec = spec[n-1], spec[:n-1]
	}
	width, prec, _ := strings.Cut(spec, ".")
	w, _ := strconv.Atoi(width)
	var out string
	switch kind {
	case 'd', 'x':
		n, _ := v.(py.Int)
		out = strconv.FormatInt(int64(n), map[byte]int{'d': 10, 'x': 16}[kind])
	case 'f', 'e', 'g', '%':
		var f float64
		switch x := v.(type) {
		case py.Float:
			f = float64(x)
		case py.Int:
			f = float64(x)
		}
		p := 6
		if prec != "" {
			p, _ = strconv.Atoi(prec)
		}
		if kind == '%' {
			out = strconv.FormatFloat(f*100, 'f', p, 64) + "%"
		} else {
			out = strconv.FormatFloat(f, kind, p, 64)
		}
	default:
		out = string(asString(v))
	}
	if pad := w - len([]rune(out)); pad > 0 {
		fill := " "
		if zero && align == 0 {
			fill = "0"
		}
		switch {
		case align == '<' || align == 0 && kind == 's':
			out += strings.Repeat(fill, pad)
		case align == '^':
			out = strings.Repeat(fill, pad/2) + out + strings.Repeat(fill, pad-pad/2)
		default:
			out = strings.Repeat(fill, pad) + out
		}
	}
	return out
}

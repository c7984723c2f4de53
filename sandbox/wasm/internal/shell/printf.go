package shell

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

// printfFormat formats args with a printf(1) format as bash does: the
// format is reused while arguments remain; missing arguments are empty or
// zero; %b interprets escapes in its argument and \c there stops all
// output. It returns the output and the conversion errors (bash prints
// them and exits 1, after printing what it could).
func printfFormat(format string, args []string) (string, []string) {
	var b strings.Builder
	var errs []string
	for {
		used, stop := printfOnce(&b, format, args, &errs)
		if stop || used == 0 || used >= len(args) {
			break
		}
		args = args[used:]
	}
	return b.String(), errs
}

// printfOnce runs the format once; used counts the arguments consumed.
func printfOnce(b *strings.Builder, format string, args []string, errs *[]string) (used int, stop bool) {
	next := func() (string, bool) {
		if used < len(args) {
			used++
			return args[used-1], true
		}
		return "", false
	}
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c == '\\' {
			s, n, stopHere := escapeAt(format, i, false)
			b.WriteString(s)
			i += n - 1
			if stopHere {
				return used, true
			}
			continue
		}
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(format) && format[i+1] == '%' {
			b.WriteByte('%')
			i++
			continue
		}
		// %[flags][width][.precision]conv
		j := i + 1
		flags := ""
		for j < len(format) && strings.IndexByte("-+ #0", format[j]) >= 0 {
			flags += string(format[j])
			j++
		}
		width, prec := "", ""
		readNum := func() string {
			if j < len(format) && format[j] == '*' {
				j++
				a, _ := next()
				n, err := strconv.Atoi(strings.TrimSpace(a))
				if err != nil && a != "" {
					*errs = append(*errs, a+": invalid number")
				}
				return strconv.Itoa(n)
			}
			k := j
			for j < len(format) && format[j] >= '0' && format[j] <= '9' {
				j++
			}
			return format[k:j]
		}
		width = readNum()
		hasPrec := false
		if j < len(format) && format[j] == '.' {
			j++
			hasPrec = true
			prec = readNum()
			if prec == "" {
				prec = "0"
			}
		}
		for j < len(format) && strings.IndexByte("hlLqjzt", format[j]) >= 0 && format[j] != 'q' {
			j++ // length modifiers are accepted and ignored
		}
		if j >= len(format) {
			*errs = append(*errs, "`"+format[i:]+"': missing format character")
			b.WriteString(format[i:])
			return used, true
		}
		conv := format[j]
		i = j
		if strings.HasPrefix(width, "-") {
			flags += "-"
			width = width[1:]
		}
		spec := "%" + flags + width
		if hasPrec {
			spec += "." + prec
		}
		arg, _ := next()
		switch conv {
		case 'd', 'i':
			n, err := printfInt(arg)
			if err != nil {
				*errs = append(*errs, arg+": invalid number")
			}
			fmt.Fprintf(b, spec+"d", n)
		case 'o', 'u', 'x', 'X':
			n, err := printfInt(arg)
			if err != nil {
				*errs = append(*errs, arg+": invalid number")
			}
			verb := string(conv)
			if conv == 'u' {
				verb = "d"
			}
			fmt.Fprintf(b, spec+verb, uint64(n))
		case 'e', 'E', 'f', 'F', 'g', 'G', 'a', 'A':
			f, err := printfFloat(arg)
			if err != nil {
				*errs = append(*errs, arg+": invalid number")
			}
			verb := string(conv)
			switch conv {
			case 'F':
				verb = "f"
			case 'a':
				verb = "x"
			case 'A':
				verb = "X"
			}
			fmt.Fprintf(b, spec+verb, f)
		case 'c':
			r := ""
			if arg != "" {
				_, n := utf8.DecodeRuneInString(arg)
				r = arg[:n]
			}
			fmt.Fprintf(b, strings.Split(spec, ".")[0]+"s", r)
		case 's':
			fmt.Fprintf(b, spec+"s", arg)
		case 'b':
			s, stopHere := echoEscapes(arg)
			fmt.Fprintf(b, spec+"s", s)
			if stopHere {
				return used, true
			}
		case 'q':
			fmt.Fprintf(b, strings.Split(spec, ".")[0]+"s", bashQuote(arg))
		default:
			*errs = append(*errs, fmt.Sprintf("%%%c: invalid format character", conv))
			return used, true
		}
	}
	return used, false
}

// printfInt parses a printf integer argument: decimal, 0x hex, 0 octal, or
// 'c (the character's code).
func printfInt(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, nil
	}
	if t[0] == '\'' || t[0] == '"' {
		if len(t) == 1 {
			return 0, nil
		}
		r, _ := utf8.DecodeRuneInString(t[1:])
		return int64(r), nil
	}
	n, err := strconv.ParseInt(t, 0, 64)
	if err != nil {
		if u, uerr := strconv.ParseUint(t, 0, 64); uerr == nil {
			return int64(u), nil
		}
		// Leading digits count, as strtol does.
		k := 0
		if k < len(t) && (t[k] == '-' || t[k] == '+') {
			k++
		}
		for k < len(t) && t[k] >= '0' && t[k] <= '9' {
			k++
		}
		n, _ = strconv.ParseInt(t[:k], 10, 64)
		return n, err
	}
	return n, nil
}

func printfFloat(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, nil
	}
	if t[0] == '\'' || t[0] == '"' {
		n, err := printfInt(t)
		return float64(n), err
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil {
		if n, ierr := strconv.ParseInt(t, 0, 64); ierr == nil {
			return float64(n), nil
		}
		return math.NaN(), err
	}
	return f, nil
}

// escapeAt interprets the backslash escape at s[i] of a printf format; n is
// its length in s.
func escapeAt(s string, i int, inB bool) (out string, n int, stop bool) {
	if i+1 >= len(s) {
		return "\\", 1, false
	}
	switch c := s[i+1]; c {
	case 'a':
		return "\a", 2, false
	case 'b':
		return "\b", 2, false
	case 'e', 'E':
		return "\x1b", 2, false
	case 'f':
		return "\f", 2, false
	case 'n':
		return "\n", 2, false
	case 'r':
		return "\r", 2, false
	case 't':
		return "\t", 2, false
	case 'v':
		return "\v", 2, false
	case '\\':
		return "\\", 2, false
	case '"':
		return "\"", 2, false
	case '\'':
		return "'", 2, false
	case '?':
		return "?", 2, false
	case 'c':
		return "", 2, true
	case '0', '1', '2', '3', '4', '5', '6', '7':
		v, j := 0, i+1
		for ; j < len(s) && j < i+4 && s[j] >= '0' && s[j] <= '7'; j++ {
			v = v*8 + int(s[j]-'0')
		}
		return string([]byte{byte(v)}), j - i, false
	case 'x':
		v, j := 0, i+2
		for ; j < len(s) && j < i+4 && isHex(s[j]); j++ {
			v = v*16 + hexVal(s[j])
		}
		if j == i+2 {
			return "\\x", 2, false
		}
		return string([]byte{byte(v)}), j - i, false
	case 'u', 'U':
		max := 4
		if c == 'U' {
			max = 8
		}
		v, j := 0, i+2
		for ; j < len(s) && j < i+2+max && isHex(s[j]); j++ {
			v = v*16 + hexVal(s[j])
		}
		if j == i+2 {
			return "\\" + string(c), 2, false
		}
		return string(rune(v)), j - i, false
	}
	return s[i : i+2], 2, false
}

// bashQuote quotes s as bash's printf %q does: backslashes before shell
// metacharacters, $'...' when there are control characters, ” when empty.
func bashQuote(s string) string {
	if s == "" {
		return "''"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			q, err := syntax.Quote(s, syntax.LangBash)
			if err != nil {
				return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
			}
			return q
		}
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(" \t!\"#$&'()*,;<>?[\\]^`{|}", c) >= 0 || c == '~' && i == 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

package shell

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

func cmdSleep(c *cmd) int {
	var total time.Duration
	for _, a := range c.args[1:] {
		unit := time.Second
		switch {
		case strings.HasSuffix(a, "s"):
			a = strings.TrimSuffix(a, "s")
		case strings.HasSuffix(a, "m"):
			a, unit = strings.TrimSuffix(a, "m"), time.Minute
		case strings.HasSuffix(a, "h"):
			a, unit = strings.TrimSuffix(a, "h"), time.Hour
		case strings.HasSuffix(a, "d"):
			a, unit = strings.TrimSuffix(a, "d"), 24*time.Hour
		}
		v, err := strconv.ParseFloat(a, 64)
		if err != nil || v < 0 {
			return c.errf("invalid time interval '%s'", a)
		}
		total += time.Duration(v * float64(unit))
	}
	t := time.NewTimer(total)
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-c.ctx.Done():
		return 137
	}
}

func cmdEnv(c *cmd) int {
	args := c.args[1:]
	var extra []string
	for len(args) > 0 {
		if args[0] == "-i" || args[0] == "-" {
			args = args[1:]
			continue
		}
		if strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "=") {
			extra = append(extra, args[0])
			args = args[1:]
			continue
		}
		break
	}
	if len(args) == 0 {
		c2 := *c
		c2.extra = append(append([]string(nil), c.extra...), extra...)
		for _, kv := range c2.environ() {
			fmt.Fprintln(c.stdout, kv)
		}
		return 0
	}
	return c.sub(c.ctx, args, nil, extra)
}

func cmdPrintenv(c *cmd) int {
	env := envMap(c.environ())
	if len(c.args) == 1 {
		for _, kv := range c.environ() {
			fmt.Fprintln(c.stdout, kv)
		}
		return 0
	}
	code := 0
	for _, n := range c.args[1:] {
		v, ok := env[n]
		if !ok {
			code = 1
			continue
		}
		fmt.Fprintln(c.stdout, v)
	}
	return code
}

func cmdDate(c *cmd) int {
	now := time.Now().UTC()
	for _, a := range c.args[1:] {
		if strings.HasPrefix(a, "+") {
			fmt.Fprintln(c.stdout, strftime(now, a[1:]))
			return 0
		}
	}
	fmt.Fprintln(c.stdout, now.Format("Mon Jan _2 15:04:05 UTC 2006"))
	return 0
}

func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			b.WriteString(t.Format("2006"))
		case 'm':
			b.WriteString(t.Format("01"))
		case 'd':
			b.WriteString(t.Format("02"))
		case 'H':
			b.WriteString(t.Format("15"))
		case 'M':
			b.WriteString(t.Format("04"))
		case 'S':
			b.WriteString(t.Format("05"))
		case 's':
			b.WriteString(strconv.FormatInt(t.Unix(), 10))
		case 'N':
			fmt.Fprintf(&b, "%09d", t.Nanosecond())
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'b':
			b.WriteString(t.Format("Jan"))
		case 'Z':
			b.WriteString("UTC")
		case 'z':
			b.WriteString("+0000")
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

func cmdUname(c *cmd) int {
	if len(c.args) > 1 && (c.args[1] == "-a" || c.args[1] == "--all") {
		fmt.Fprintln(c.stdout, "WASI sandbox 1.0 rollbox wasm32 WASI")
		return 0
	}
	if len(c.args) > 1 && c.args[1] == "-m" {
		fmt.Fprintln(c.stdout, "wasm32")
		return 0
	}
	fmt.Fprintln(c.stdout, "WASI")
	return 0
}

func cmdTimeout(c *cmd) int {
	args := c.args[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		if args[0] == "-s" || args[0] == "-k" {
			args = args[1:]
		}
		args = args[1:]
	}
	if len(args) < 2 {
		return c.errf("missing operand")
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		v, err2 := strconv.ParseFloat(args[0], 64)
		if err2 != nil {
			return c.errf("invalid time interval '%s'", args[0])
		}
		d = time.Duration(v * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(c.ctx, d)
	defer cancel()
	code := c.sub(ctx, args[1:], nil, nil)
	if ctx.Err() != nil && c.ctx.Err() == nil {
		return 124
	}
	return code
}

func cmdXargs(c *cmd) int {
	args := c.args[1:]
	maxArgs := 0
	replace := ""
	nul := false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch {
		case args[0] == "-n" && len(args) > 1:
			maxArgs, _ = strconv.Atoi(args[1])
			args = args[1:]
		case strings.HasPrefix(args[0], "-n"):
			maxArgs, _ = strconv.Atoi(args[0][2:])
		case args[0] == "-I" && len(args) > 1:
			replace = args[1]
			args = args[1:]
		case args[0] == "-0":
			nul = true
		case args[0] == "-r":
		default:
			return c.errf("unsupported option %s", args[0])
		}
		args = args[1:]
	}
	if len(args) == 0 {
		args = []string{"echo"}
	}
	data, err := c.readAll(c.stdin)
	if err != nil {
		return 137
	}
	var items []string
	if nul {
		for _, s := range strings.Split(string(data), "\x00") {
			if s != "" {
				items = append(items, s)
			}
		}
	} else if replace != "" {
		for _, s := range strings.Split(string(data), "\n") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
	} else {
		items = strings.Fields(string(data))
	}
	code := 0
	run := func(argv []string) {
		if st := c.sub(c.ctx, argv, strings.NewReader(""), nil); st != 0 {
			code = 123
		}
	}
	if replace != "" {
		for _, it := range items {
			argv := make([]string, len(args))
			for i, a := range args {
				argv[i] = strings.ReplaceAll(a, replace, it)
			}
			run(argv)
		}
		return code
	}
	if maxArgs <= 0 {
		maxArgs = max(len(items), 1)
	}
	if len(items) == 0 {
		run(append([]string(nil), args...))
		return code
	}
	for i := 0; i < len(items); i += maxArgs {
		run(append(append([]string(nil), args...), items[i:min(i+maxArgs, len(items))]...))
	}
	return code
}

func cmdExpr(c *cmd) int {
	a := c.args[1:]
	if len(a) == 3 {
		x, err1 := strconv.ParseInt(a[0], 10, 64)
		y, err2 := strconv.ParseInt(a[2], 10, 64)
		if err1 == nil && err2 == nil {
			var v int64
			switch a[1] {
			case "+":
				v = x + y
			case "-":
				v = x - y
			case "*":
				v = x * y
			case "/", "%":
				if y == 0 {
					fmt.Fprintln(c.stderr, "expr: division by zero")
					return 2
				}
				if a[1] == "/" {
					v = x / y
				} else {
					v = x % y
				}
			default:
				goto str
			}
			fmt.Fprintln(c.stdout, v)
			if v == 0 {
				return 1
			}
			return 0
		}
	}
str:
	if len(a) == 2 && a[0] == "length" {
		fmt.Fprintln(c.stdout, len(a[1]))
		return 0
	}
	if len(a) == 1 {
		fmt.Fprintln(c.stdout, a[0])
		return 0
	}
	fmt.Fprintln(c.stderr, "expr: unsupported expression")
	return 2
}

func envMap(kvs []string) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

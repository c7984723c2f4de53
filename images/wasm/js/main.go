// Command js is the JavaScript interpreter of the WASM backend: goja (an
// ECMAScript 5.1+ engine with much of ES2015+, written in Go) built for
// GOOS=wasip1, with console.log/info/warn/error, process.argv, process.env
// and process.exit. There is no require(), no event loop (setTimeout runs
// nothing) and no network.
//
// Usage: js -e CODE [ARG...] | js FILE [ARG...] | js [-] < FILE
//
// Exit status: 0, the code given to process.exit, or 1 for an uncaught
// exception (its stack on stderr).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dop251/goja"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type exitCode int

func run(args []string) int {
	var src, name string
	switch {
	case len(args) > 0 && (args[0] == "-e" || args[0] == "--eval" || args[0] == "-p"):
		if len(args) < 2 {
			fmt.Fprintf(os.Stderr, "js: %s requires an argument\n", args[0])
			return 9
		}
		src, name = args[1], "[eval]"
		if args[0] == "-p" {
			src = "console.log(eval(" + strconvQuote(args[1]) + "))"
		}
		args = args[2:]
	case len(args) > 0 && (args[0] == "-v" || args[0] == "--version"):
		fmt.Println("goja (Rollbox js on WASI)")
		return 0
	case len(args) > 0 && args[0] != "-":
		data, err := os.ReadFile(args[0])
		if err != nil {
			fmt.Fprintf(os.Stderr, "js: cannot open '%s': %v\n", args[0], err)
			return 1
		}
		src, name, args = string(data), args[0], args[1:]
		if strings.HasPrefix(src, "#!") {
			src = "//" + src // keep line numbers
		}
	default:
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "js: reading stdin: %v\n", err)
			return 1
		}
		src, name = string(data), "[stdin]"
		if len(args) > 0 {
			args = args[1:]
		}
	}
	vm := goja.New()
	vm.SetFieldNameMapper(goja.TagFieldNameMapper("json", true))
	console := vm.NewObject()
	out := func(w io.Writer) func(goja.FunctionCall) goja.Value {
		return func(call goja.FunctionCall) goja.Value {
			parts := make([]string, len(call.Arguments))
			for i, a := range call.Arguments {
				parts[i] = format(vm, a, i == 0)
			}
			fmt.Fprintln(w, strings.Join(parts, " "))
			return goja.Undefined()
		}
	}
	console.Set("log", out(os.Stdout))
	console.Set("info", out(os.Stdout))
	console.Set("debug", out(os.Stdout))
	console.Set("warn", out(os.Stderr))
	console.Set("error", out(os.Stderr))
	vm.Set("console", console)
	process := vm.NewObject()
	process.Set("argv", append([]string{"js", name}, args...))
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	process.Set("env", env)
	process.Set("platform", "wasi")
	process.Set("exit", func(call goja.FunctionCall) goja.Value {
		code := 0
		if len(call.Arguments) > 0 {
			code = int(call.Arguments[0].ToInteger())
		}
		panic(exitCode(code))
	})
	stdout := vm.NewObject()
	stdout.Set("write", func(s string) bool { io.WriteString(os.Stdout, s); return true })
	process.Set("stdout", stdout)
	vm.Set("process", process)
	return runScript(vm, name, src)
}

func runScript(vm *goja.Runtime, name, src string) (code int) {
	defer func() {
		if r := recover(); r != nil {
			c, ok := r.(exitCode)
			if !ok {
				panic(r)
			}
			code = int(c)
		}
	}()
	if _, err := vm.RunScript(name, src); err != nil {
		if ex, ok := err.(*goja.Exception); ok {
			fmt.Fprintln(os.Stderr, "Uncaught "+ex.String())
		} else {
			fmt.Fprintln(os.Stderr, err)
		}
		return 1
	}
	return 0
}

// format renders a value like node's console.log: strings bare, other
// values as JSON where possible.
func format(vm *goja.Runtime, v goja.Value, first bool) string {
	if v == nil || goja.IsUndefined(v) {
		return "undefined"
	}
	if goja.IsNull(v) {
		return "null"
	}
	switch v.Export().(type) {
	case string:
		return v.String()
	case int64, float64, bool:
		return v.String()
	}
	if obj, ok := v.(*goja.Object); ok {
		if _, isFn := goja.AssertFunction(obj); isFn {
			return "[Function]"
		}
		if obj.ClassName() == "Error" {
			return obj.Get("stack").String()
		}
		if b, err := json.Marshal(obj.Export()); err == nil {
			return string(b)
		}
	}
	return v.String()
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Command python is Rollbox's default Python for the WASM backend: the
// gpython interpreter (a Python 3.4 subset written in Go) built for
// GOOS=wasip1. gpython's own sys module calls os.Executable when its package
// initialises, which panics on wasip1, so this program does not import
// gpython's stdlib bundle: it wires a context of its own (context.go, adapted
// from gpython's stdlib.go) with a sys module that needs no executable path.
//
// Usage: python -c CODE [ARG...] | python FILE [ARG...] | python [-] < FILE
//
// Exit status: 0, the code given to sys.exit, or 1 for an uncaught exception
// (its traceback on stderr).
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-python/gpython/py"
)

const version = "3.4.0 (gpython 0.2.0 on WASI; Rollbox's default Python)"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var src, name string
	var argv []string
	switch {
	case len(args) > 0 && (args[0] == "-V" || args[0] == "--version"):
		fmt.Println("Python " + strings.Fields(version)[0])
		return 0
	case len(args) > 0 && args[0] == "-c":
		if len(args) < 2 {
			fmt.Fprintln(os.Stderr, "Argument expected for the -c option")
			return 2
		}
		src, name, argv = args[1], "<string>", append([]string{"-c"}, args[2:]...)
	case len(args) > 0 && args[0] == "-m":
		fmt.Fprintln(os.Stderr, "python: -m is not supported by Rollbox's default Python (gpython)")
		return 2
	case len(args) > 0 && args[0] != "-":
		data, err := os.ReadFile(args[0])
		if err != nil {
			fmt.Fprintf(os.Stderr, "python: can't open file '%s': %v\n", args[0], err)
			return 2
		}
		src, name, argv = string(data), args[0], args
	default:
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "python: reading stdin: %v\n", err)
			return 1
		}
		src, name, argv = string(data), "<stdin>", []string{"-"}
		if len(args) > 1 {
			argv = append(argv, args[1:]...)
		}
	}
	registerSys()
	addMethods()
	ctx := newContext(argv, []string{".", "/usr/lib/python"})
	defer ctx.Close()
	code, err := py.Compile(src+"\n", name, py.ExecMode, 0, true)
	if err == nil {
		_, err = py.RunCode(ctx, code, name, nil)
	}
	if err == nil {
		return 0
	}
	return exitStatus(err)
}

// exitStatus turns an uncaught exception into the process status the way
// CPython does: SystemExit(code) exits with code, anything else prints the
// traceback and exits 1.
func exitStatus(err error) int {
	var exc *py.Exception
	switch e := err.(type) {
	case py.ExceptionInfo:
		exc, _ = e.Value.(*py.Exception)
	case *py.ExceptionInfo:
		exc, _ = e.Value.(*py.Exception)
	case *py.Exception:
		exc = e
	}
	if exc != nil && exc.Type() == py.SystemExit {
		args, _ := exc.Args.(py.Tuple)
		if len(args) == 0 || args[0] == py.None {
			return 0
		}
		switch v := args[0].(type) {
		case py.Int:
			return int(v) & 0xff
		case py.Bool:
			if v {
				return 1
			}
			return 0
		case py.String:
			fmt.Fprintln(os.Stderr, string(v))
			return 1
		default:
			fmt.Fprintln(os.Stderr, v)
			return 1
		}
	}
	py.TracebackDump(err)
	return 1
}

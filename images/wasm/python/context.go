// Adapted from github.com/go-python/gpython stdlib/stdlib.go (BSD-style
// license, Copyright 2022 The go-python Authors): the same py.Context, minus
// the import of gpython's sys module, whose package init calls
// os.Executable (unsupported on wasip1).

package main

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-python/gpython/py"
	"github.com/go-python/gpython/stdlib/marshal"
	"github.com/go-python/gpython/vm"

	_ "github.com/go-python/gpython/stdlib/binascii"
	_ "github.com/go-python/gpython/stdlib/builtin"
	_ "github.com/go-python/gpython/stdlib/glob"
	_ "github.com/go-python/gpython/stdlib/math"
	_ "github.com/go-python/gpython/stdlib/os"
	_ "github.com/go-python/gpython/stdlib/string"
	_ "github.com/go-python/gpython/stdlib/tempfile"
	_ "github.com/go-python/gpython/stdlib/time"
)

// context implements py.Context.
type context struct {
	store     *py.ModuleStore
	closeOnce sync.Once
	closed    bool
	running   sync.WaitGroup
	done      chan struct{}
}

func newContext(argv, paths []string) *context {
	ctx := &context{done: make(chan struct{}), store: py.NewModuleStore()}
	py.Import(ctx, "builtins", "sys")
	sys := ctx.store.MustGetModule("sys")
	sys.Globals["argv"] = py.NewListFromStrings(argv)
	sys.Globals["path"] = py.NewListFromStrings(paths)
	return ctx
}

func (ctx *context) ModuleInit(impl *py.ModuleImpl) (*py.Module, error) {
	if err := ctx.pushBusy(); err != nil {
		return nil, err
	}
	defer ctx.popBusy()
	var err error
	if impl.Code == nil && len(impl.CodeSrc) > 0 {
		impl.Code, err = py.Compile(string(impl.CodeSrc), impl.Info.FileDesc, py.ExecMode, 0, true)
		if err != nil {
			return nil, err
		}
	}
	if impl.Code == nil && len(impl.CodeBuf) > 0 {
		obj, err := marshal.ReadObject(bytes.NewBuffer(impl.CodeBuf))
		if err != nil {
			return nil, err
		}
		impl.Code, _ = obj.(*py.Code)
		if impl.Code == nil {
			return nil, py.ExceptionNewf(py.AssertionError, "Embedded code did not produce a py.Code object")
		}
	}
	module, err := ctx.store.NewModule(ctx, impl)
	if err != nil {
		return nil, err
	}
	if impl.Code != nil {
		if _, err := ctx.RunCode(impl.Code, module.Globals, module.Globals, nil); err != nil {
			return nil, err
		}
	}
	return module, nil
}

func (ctx *context) ResolveAndCompile(pathname string, opts py.CompileOpts) (py.CompileOut, error) {
	if err := ctx.pushBusy(); err != nil {
		return py.CompileOut{}, err
	}
	defer ctx.popBusy()
	tryPaths := []py.Object{py.String(".")}
	if opts.UseSysPaths {
		tryPaths = ctx.store.MustGetModule("sys").Globals["path"].(*py.List).Items
	}
	out := py.CompileOut{}
	err := resolveRunPath(pathname, opts, tryPaths, func(fpath string) (bool, error) {
		stat, err := os.Stat(fpath)
		if err == nil && stat.IsDir() {
			fpath = path.Join(fpath, "__init__.py")
			_, err = os.Stat(fpath)
		}
		ext := strings.ToLower(filepath.Ext(fpath))
		if ext == "" && os.IsNotExist(err) {
			fpath += ".py"
			ext = ".py"
			_, err = os.Stat(fpath)
		}
		if err != nil {
			if os.IsNotExist(err) {
				return true, nil
			}
			return false, py.ExceptionNewf(py.OSError, "Error accessing %q: %v", fpath, err)
		}
		switch ext {
		case ".py":
			src, err := os.ReadFile(fpath)
			if err != nil {
				return false, py.ExceptionNewf(py.OSError, "Error reading %q: %v", fpath, err)
			}
			if out.Code, err = py.Compile(string(src), fpath, py.ExecMode, 0, true); err != nil {
				return false, err
			}
			out.SrcPathname = fpath
		case ".pyc":
			file, err := os.Open(fpath)
			if err != nil {
				return false, py.ExceptionNewf(py.OSError, "Error opening %q: %v", fpath, err)
			}
			defer file.Close()
			obj, err := marshal.ReadPyc(file)
			if err != nil {
				return false, py.ExceptionNewf(py.ImportError, "Failed to marshal %q: %v", fpath, err)
			}
			out.Code, _ = obj.(*py.Code)
			out.PycPathname = fpath
		}
		out.FileDesc = fpath
		return false, nil
	})
	if out.Code == nil && err == nil {
		err = py.ExceptionNewf(py.AssertionError, "Missing code object")
	}
	if err != nil {
		return py.CompileOut{}, err
	}
	return out, nil
}

func resolveRunPath(runPath string, opts py.CompileOpts, pathObjs []py.Object, tryPath func(string) (bool, error)) error {
	runPath = strings.TrimSuffix(runPath, "/")
	cont := true
	var err error
	cwd := ""
	for _, pathObj := range pathObjs {
		pathStr, ok := pathObj.(py.String)
		if !ok {
			continue
		}
		fpath := path.Join(string(pathStr), runPath)
		if filepath.IsAbs(fpath) {
			cont, err = tryPath(fpath)
		} else {
			if opts.CurDir != "" {
				cont, err = tryPath(path.Join(opts.CurDir, fpath))
			}
			if cont && err == nil {
				if cwd == "" {
					cwd, _ = os.Getwd()
				}
				cont, err = tryPath(path.Join(cwd, fpath))
			}
		}
		if !cont || err != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	if cont {
		return py.ExceptionNewf(py.FileNotFoundError, "Failed to resolve %q", runPath)
	}
	return nil
}

func (ctx *context) pushBusy() error {
	if ctx.closed {
		return py.ExceptionNewf(py.RuntimeError, "Context closed")
	}
	ctx.running.Add(1)
	return nil
}

func (ctx *context) popBusy() { ctx.running.Done() }

func (ctx *context) Close() error {
	ctx.closeOnce.Do(func() {
		ctx.running.Wait()
		ctx.closed = true
		ctx.store.OnContextClosed()
		close(ctx.done)
	})
	return nil
}

func (ctx *context) Done() <-chan struct{} { return ctx.done }

func (ctx *context) RunCode(code *py.Code, globals, locals py.StringDict, closure py.Tuple) (py.Object, error) {
	if err := ctx.pushBusy(); err != nil {
		return nil, err
	}
	defer ctx.popBusy()
	return vm.EvalCode(ctx, code, globals, locals, nil, nil, nil, nil, closure)
}

func (ctx *context) GetModule(name string) (*py.Module, error) { return ctx.store.GetModule(name) }

func (ctx *context) Store() *py.ModuleStore { return ctx.store }

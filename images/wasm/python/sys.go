package main

import (
	"os"

	"github.com/go-python/gpython/py"
)

// registerSys registers a sys module that, unlike gpython's, does not ask
// for the executable's path.
func registerSys() {
	stdin := &py.File{File: os.Stdin, FileMode: py.FileRead}
	stdout := &py.File{File: os.Stdout, FileMode: py.FileWrite}
	stderr := &py.File{File: os.Stderr, FileMode: py.FileWrite}
	py.RegisterModule(&py.ModuleImpl{
		Info: py.ModuleInfo{Name: "sys", Doc: "System-specific parameters (Rollbox's, for WASI)."},
		Methods: []*py.Method{
			py.MustNewMethod("exit", sysExit, 0, "exit([status]): raise SystemExit(status)."),
			py.MustNewMethod("getrecursionlimit", func(py.Object) (py.Object, error) { return py.Int(1000), nil }, 0, ""),
			py.MustNewMethod("getdefaultencoding", func(py.Object) (py.Object, error) { return py.String("utf-8"), nil }, 0, ""),
		},
		Globals: py.StringDict{
			"argv": py.NewList(), "path": py.NewList(), "modules": py.StringDict{},
			"stdin": stdin, "stdout": stdout, "stderr": stderr,
			"__stdin__": stdin, "__stdout__": stdout, "__stderr__": stderr,
			"executable": py.String("/usr/bin/python3"), "platform": py.String("wasi"),
			"version": py.String(version), "maxsize": py.Int(1<<63 - 1),
			"byteorder":    py.String("little"),
			"version_info": py.Tuple{py.Int(3), py.Int(4), py.Int(0), py.String("final"), py.Int(0)},
		},
	})
}

func sysExit(self py.Object, args py.Tuple) (py.Object, error) {
	var code py.Object = py.None
	if err := py.UnpackTuple(args, nil, "exit", 0, 1, &code); err != nil {
		return nil, err
	}
	exc, err := py.ExceptionNew(py.SystemExit, args, nil)
	if err != nil {
		return nil, err
	}
	return nil, exc.(*py.Exception)
}

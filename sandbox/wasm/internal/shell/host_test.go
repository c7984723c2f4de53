package shell

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hostThreads is this process's OS thread count.
func hostThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// listTree lists a host directory tree, for before/after comparisons.
func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// The attacks found against the interpreter this package replaced: each
// reached the host through it. Here none may leave a trace on the host.
func TestNoCommandTouchesTheHost(t *testing.T) {
	hostDir := t.TempDir()
	hostTmp := t.TempDir()
	t.Setenv("TMPDIR", hostTmp) // what os.TempDir would answer
	before := listTree(t, hostDir)
	beforeTmp := listTree(t, hostTmp)
	attacks := []string{
		// temp files and FIFOs in a directory of the agent's choosing
		`env TMPDIR=` + hostDir + ` sh -c 'cat <(echo "* * * * * root touch /tmp/pwned") > x; cat <<EOF > y
heredoc
EOF'`,
		`export TMPDIR=` + hostDir + `; cat <(echo a) >(cat) <<<"b"; echo c | cat`,
		`TMPDIR=` + hostDir + ` eval 'cat <(echo hi)'`,
		`cd ` + hostDir + ` 2>/dev/null; echo pwned > ` + hostDir + `/file; echo > /etc/cron.d/x`,
		`exec 3>` + hostDir + `/fd3; echo x >&3`,
		`mkdir -p ` + hostDir + `/d; touch ` + hostDir + `/t; ln -s / ` + hostDir + `/l`,
	}
	for _, a := range attacks {
		out, errs, o := run(t, newFS(), a)
		t.Logf("%q: exit %d stdout %q stderr %q", a, o.ExitCode, out, errs)
	}
	if after := listTree(t, hostDir); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("the host directory changed:\n%s", strings.Join(after, "\n"))
	}
	if after := listTree(t, hostTmp); strings.Join(after, "\n") != strings.Join(beforeTmp, "\n") {
		t.Errorf("the host's temp directory changed:\n%s", strings.Join(after, "\n"))
	}
}

func TestPathsPidsAndNamesAreTheSandboxs(t *testing.T) {
	exe, _ := os.Executable()
	out, errs, _ := run(t, newFS(), `PWD=/proc/self/exe pwd -P; cd -P /proc/self 2>/dev/null; pwd -P; realpath /proc/self/exe; readlink -f /proc/self/exe; echo $$ $PPID $BASHPID; echo ~root ~daemon ~nobody; hostname; whoami; id`)
	if strings.Contains(out, exe) || strings.Contains(out, filepath.Dir(exe)) || strings.Contains(errs, exe) {
		t.Errorf("a host path leaked: stdout %q stderr %q", out, errs)
	}
	if !strings.Contains(out, "1 0 ") {
		t.Errorf("$$ and $PPID are not the sandbox's 1 and 0: %q", out)
	}
	if !strings.Contains(out, "/root ~daemon ~nobody") {
		t.Errorf("~user was looked up somewhere: %q", out)
	}
	if pid := strconv.Itoa(os.Getpid()); strings.Contains(out, " "+pid+" ") || strings.HasPrefix(out, pid) {
		t.Errorf("the host pid %s leaked: %q", pid, out)
	}
}

// Process substitution run at scale neither blocks host threads nor leaves
// anything behind: the crash this replaces was "fatal error: thread
// exhaustion" after 10,100 of them.
func TestProcessSubstitutionAtScaleHoldsNoHostThread(t *testing.T) {
	threads := hostThreads(t)
	goroutines := runtime.NumGoroutine()
	hostTmp := t.TempDir()
	t.Setenv("TMPDIR", hostTmp)
	start := time.Now()
	out, errs, o := run(t, newFS(), `n=0; for i in $(seq 10100); do eval 'cat <(echo hi) >/dev/null' && n=$((n+1)); done; echo $n`)
	if out != "10100\n" || o.ExitCode != 0 {
		t.Errorf("stdout %q exit %d stderr %q", out, o.ExitCode, errs)
	}
	t.Logf("10,100 process substitutions in %v", time.Since(start))
	if now := hostThreads(t); now > threads+4 {
		t.Errorf("host threads grew from %d to %d", threads, now)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines+2 {
		t.Errorf("%d goroutines left (%d before)", n, goroutines)
	}
	if l := listTree(t, hostTmp); len(l) != 1 {
		t.Errorf("host temp dir holds %v", l)
	}
}

// The memory cap holds for code built at run time too (eval, sh -c,
// source, functions, traps): the expansion that reached 406 MB under a 16
// MB cap through eval now stops at the cap.
func TestMemoryCapHoldsForCodeBuiltAtRunTime(t *testing.T) {
	for _, script := range []string{
		`eval 'x=a; while true; do x=$x$x; done'`,
		`eval 'cat <(x=a; while true; do x=$x$x; done)'`,
		`sh -c 'x=a; while true; do x=$x$x; done'`,
		`echo 'x=a; while true; do x=$x$x; done' > s; . ./s`,
		`f() { x=a; while true; do x=$x$x; done; }; f`,
		`trap 'x=a; while true; do x=$x$x; done' EXIT`,
		`command eval 'x=a; while :; do x=$x$x; done'`,
		`builtin eval 'x=a; while :; do x=$x$x; done'`,
		`e=eval; $e 'x=a; while :; do x=$x$x; done'`,
		`x=$(head -c 500000 /dev/zero | tr '\0' a); y=${x//a/$x}`,
		`x=$(head -c 1000 /dev/zero | tr '\0' a); y=${x//a/$(head -c 100000 /dev/zero)}`,
		`read -r x < <(yes | tr -d '\n')`,
		`yes | tr -d '\n' | grep x`,
		`yes | tr -d '\n' | sed s/y/yy/`,
		`yes | sort`,
		`yes | tail -n 100000000`,
		`a=(); while :; do a+=(xxxxxxxxxxxxxxxx); done`,
		// Many variables, each charged: 1 KB each reaches the cap in
		// ~4,000 evals (quick even on a loaded machine).
		`x=$(printf %01000d 0); i=0; while :; do eval "v$i=\$x"; i=$((i+1)); done`,
		`printf '%*s' 100000000 x`,
		`cat <<EOF
$(yes)
EOF`,
	} {
		start := time.Now()
		_, errs, o := runLimit(t, newFS(), script, 4<<20)
		if !o.OOM {
			t.Errorf("%q: not stopped for memory (exit %d, stderr %q)", script, o.ExitCode, errs)
		}
		t.Logf("%q: %v: %s", script, time.Since(start), o.Reason)
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("%q: took %v", script, el)
		}
	}
}

// The package reaches nothing of the host by construction: its source
// calls no function of os, syscall, os/exec, net or x/sys/unix (only their
// constants and types), and mvdan.cc/sh/v3/interp is not linked.
func TestThePackageCallsNoHostFunction(t *testing.T) {
	allowed := map[string]map[string]bool{
		"os":      {"O_RDONLY": true, "O_WRONLY": true, "O_RDWR": true, "O_CREATE": true, "O_TRUNC": true, "O_APPEND": true, "O_EXCL": true, "FileMode": true, "ModeDir": true, "ModeSymlink": true, "ModePerm": true, "ErrClosed": true, "ErrNotExist": true, "ErrExist": true},
		"syscall": nil, // constants only: checked below
	}
	forbiddenImports := []string{"os/exec", "net", "net/http", "golang.org/x/sys/unix", "mvdan.cc/sh/v3/interp", "os/user", "os/signal", "plugin", "unsafe"}
	fset := token.NewFileSet()
	for _, dir := range []string{".", "../vfs"} {
		pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, pkg := range pkgs {
			for name, f := range pkg.Files {
				imports := map[string]string{}
				for _, im := range f.Imports {
					p, _ := strconv.Unquote(im.Path.Value)
					for _, bad := range forbiddenImports {
						if p == bad {
							t.Errorf("%s imports %s", name, p)
						}
					}
					local := filepath.Base(p)
					if im.Name != nil {
						local = im.Name.Name
					}
					imports[local] = p
				}
				ast.Inspect(f, func(n ast.Node) bool {
					sel, ok := n.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					id, ok := sel.X.(*ast.Ident)
					if !ok {
						return true
					}
					switch imports[id.Name] {
					case "os":
						if !allowed["os"][sel.Sel.Name] {
							t.Errorf("%s: %s uses os.%s", name, fset.Position(sel.Pos()), sel.Sel.Name)
						}
					case "syscall":
						if s := sel.Sel.Name; !(strings.HasPrefix(s, "E") && strings.ToUpper(s) == s || strings.HasPrefix(s, "O_") || s == "Errno") {
							t.Errorf("%s: %s uses syscall.%s", name, fset.Position(sel.Pos()), s)
						}
					}
					return true
				})
			}
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to list dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		if pkg == "mvdan.cc/sh/v3/interp" {
			t.Errorf("the shell links %s", pkg)
		}
		// os/exec is linked only through mvdan.cc/sh/v3/internal's test
		// helper (testing.go), which nothing here calls.
		for _, im := range strings.Fields(imports) {
			if im == "os/exec" && pkg != "mvdan.cc/sh/v3/internal" {
				t.Errorf("%s imports os/exec", pkg)
			}
		}
	}
}

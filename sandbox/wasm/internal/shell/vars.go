package shell

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"mvdan.cc/sh/v3/expand"
)

// variable is one shell variable as a scope holds it, with the bytes it
// is charged (size). own says this store charged it; a subshell's copies of
// its parent's variables are not its own (the parent pays for them).
type variable struct {
	expand.Variable
	size int64
	own  bool
}

// varSize is what a variable is charged: its name and value bytes plus a
// fixed overhead per string.
func varSize(name string, vr expand.Variable) int64 {
	n := int64(len(name)) + int64(len(vr.Str)) + 48
	for _, s := range vr.List {
		n += int64(len(s)) + 16
	}
	n += int64(len(vr.Indexes)) * 8
	for k, v := range vr.Map {
		n += int64(len(k)+len(v)) + 32
	}
	return n
}

// varStore holds a shell's variables: the global scope and one scope per
// function call (bash's dynamic scoping: a function sees its callers'
// locals). Every write is charged to the command line's budget before it is
// made.
//
// A subshell copies the maps and shares the values (strings, slices and
// maps are not copied). While any such copy is alive, the parent neither
// edits an array in place nor releases the charge of a value it replaces
// (the copy still holds it): those charges wait in deferred until the last
// copy is dropped. A copy edits its inherited arrays only after copying
// them, at its own charge.
type varStore struct {
	mem    *budget
	parent *varStore
	scopes []map[string]*variable // [0] is global
	owned  int64                  // bytes this store charged

	children atomic.Int64 // live copies of this store
	deferred int64        // charges to release once children is 0
}

func newVarStore(mem *budget) *varStore {
	return &varStore{mem: mem, scopes: []map[string]*variable{{}}}
}

// clone copies the store for a subshell: the maps are copied (their
// overhead charged), the values shared (charged to the parent).
func (v *varStore) clone() (*varStore, error) {
	var n int64
	for _, sc := range v.scopes {
		n += int64(len(sc)) * 64
	}
	if err := v.mem.charge(n, "copying the variables for a subshell"); err != nil {
		return nil, err
	}
	c := &varStore{mem: v.mem, parent: v, scopes: make([]map[string]*variable, len(v.scopes)), owned: n}
	for i, sc := range v.scopes {
		m := make(map[string]*variable, len(sc))
		for k, vr := range sc {
			cp := *vr
			cp.own = false
			m[k] = &cp
		}
		c.scopes[i] = m
	}
	v.children.Add(1)
	return c, nil
}

// drop releases what the store charged (a subshell that ended).
func (v *varStore) drop() {
	if v.scopes == nil {
		return
	}
	v.mem.release(v.owned + v.deferred)
	v.owned, v.deferred = 0, 0
	v.scopes = nil
	if v.parent != nil {
		v.parent.children.Add(-1)
	}
}

// settle releases the deferred charges once no copy is alive.
func (v *varStore) settle() {
	if v.deferred > 0 && v.children.Load() == 0 {
		v.mem.release(v.deferred)
		v.deferred = 0
	}
}

// forget stops charging a value this store replaced or removed: released
// now, or deferred while copies may hold it.
func (v *varStore) forget(old *variable) {
	if old == nil || !old.own {
		return
	}
	v.owned -= old.size
	if v.children.Load() > 0 {
		v.deferred += old.size
		return
	}
	v.mem.release(old.size)
}

// lookup finds name in the innermost scope that has it.
func (v *varStore) lookup(name string) (*variable, int) {
	for i := len(v.scopes) - 1; i >= 0; i-- {
		if vr, ok := v.scopes[i][name]; ok {
			return vr, i
		}
	}
	return nil, -1
}

func (v *varStore) get(name string) expand.Variable {
	if vr, _ := v.lookup(name); vr != nil {
		return vr.Variable
	}
	return expand.Variable{}
}

// set replaces a variable where it lives (or globally when new), or in
// the innermost scope when local. It charges the new value and stops
// charging the old one.
func (v *varStore) set(name string, vr expand.Variable, local bool) error {
	v.settle()
	old, at := v.lookup(name)
	if local {
		at = len(v.scopes) - 1
		old = v.scopes[at][name]
	} else if at < 0 {
		at = 0
	}
	if old != nil && old.ReadOnly && vr.Kind != expand.KeepValue {
		return errReadOnly{name}
	}
	if vr.Kind == expand.KeepValue {
		if old != nil {
			vr.Kind, vr.Str, vr.List, vr.Map, vr.Indexes = old.Kind, old.Str, old.List, old.Map, old.Indexes
			vr.Set = vr.Set || old.Set
		} else {
			vr.Kind = expand.Unknown
		}
	}
	if old != nil {
		vr.Exported = vr.Exported || old.Exported
		vr.ReadOnly = vr.ReadOnly || old.ReadOnly
	}
	vr.Local = at > 0
	size := varSize(name, vr)
	if err := v.mem.charge(size, "assigning "+name); err != nil {
		return err
	}
	v.owned += size
	v.forget(old)
	v.scopes[at][name] = &variable{Variable: vr, size: size, own: true}
	return nil
}

// edit changes an existing array variable in place (appending, setting an
// element) when this store owns it and no copy shares it, or on a copy of
// it otherwise: fn edits vr and returns the change in size, charged. ok is
// false when name is no such array (the caller assigns the whole value).
func (v *varStore) edit(name string, local bool, fn func(vr *expand.Variable) (delta int64, err error)) (ok bool, err error) {
	v.settle()
	vr, at := v.lookup(name)
	if local && at != len(v.scopes)-1 {
		return false, nil
	}
	if vr == nil || vr.ReadOnly || vr.Kind != expand.Indexed && vr.Kind != expand.Associative {
		return false, nil
	}
	if !vr.own || v.children.Load() > 0 {
		if err := v.mem.charge(vr.size, "copying "+name); err != nil {
			return true, err
		}
		nv := &variable{Variable: cloneVar(vr.Variable), size: vr.size, own: true}
		v.owned += nv.size
		v.forget(vr)
		v.scopes[at][name] = nv
		vr = nv
	}
	delta, err := fn(&vr.Variable)
	if err != nil {
		return true, err
	}
	if err := v.mem.charge(delta, "assigning "+name); err != nil {
		return true, err
	}
	vr.size += delta
	v.owned += delta
	return true, nil
}

// unset removes name from the scope it lives in (a function's local stays
// declared but unset, as in bash).
func (v *varStore) unset(name string) error {
	old, at := v.lookup(name)
	if old == nil {
		return nil
	}
	if old.ReadOnly {
		return errReadOnly{name}
	}
	v.forget(old)
	if at > 0 {
		v.scopes[at][name] = &variable{Variable: expand.Variable{Local: true}}
		return nil
	}
	delete(v.scopes[at], name)
	return nil
}

// push opens a function's scope; pop closes it, releasing its locals.
func (v *varStore) push() { v.scopes = append(v.scopes, map[string]*variable{}) }

func (v *varStore) pop() {
	for _, vr := range v.scopes[len(v.scopes)-1] {
		v.forget(vr)
	}
	v.scopes = v.scopes[:len(v.scopes)-1]
}

// each visits every visible variable once (the innermost definition).
func (v *varStore) each(fn func(name string, vr expand.Variable) bool) {
	seen := map[string]bool{}
	for i := len(v.scopes) - 1; i >= 0; i-- {
		for name, vr := range v.scopes[i] {
			if seen[name] {
				continue
			}
			seen[name] = true
			if !fn(name, vr.Variable) {
				return
			}
		}
	}
}

// names lists the visible variables' names, sorted.
func (v *varStore) names() []string {
	var out []string
	v.each(func(name string, vr expand.Variable) bool {
		out = append(out, name)
		return true
	})
	slices.Sort(out)
	return out
}

// exported lists the exported, set string variables as KEY=VALUE, sorted.
func (v *varStore) exported() []string {
	var out []string
	v.each(func(name string, vr expand.Variable) bool {
		if vr.Exported && vr.IsSet() && (vr.Kind == expand.String || vr.Kind == expand.NameRef) {
			out = append(out, name+"="+vr.Str)
		}
		return true
	})
	slices.Sort(out)
	return out
}

type errReadOnly struct{ name string }

func (e errReadOnly) Error() string { return e.name + ": readonly variable" }

// environ is the expand.WriteEnviron the expansion package sees for one
// shell: its variables plus the special parameters, all answered from the
// sandbox (never the host: $$ and $PPID are the sandbox's pids, ~user is
// the sandbox's home).
type environ struct {
	sh *shell
}

var _ expand.WriteEnviron = environ{}

func strVar(s string) expand.Variable {
	return expand.Variable{Set: true, Kind: expand.String, Str: s}
}

func (e environ) Get(name string) expand.Variable {
	sh := e.sh
	switch name {
	case "#":
		return strVar(strconv.Itoa(len(sh.params)))
	case "@", "*":
		return expand.Variable{Set: true, Kind: expand.Indexed, List: append([]string{}, sh.params...)}
	case "?":
		return strVar(strconv.Itoa(sh.exit))
	case "$":
		return strVar(strconv.Itoa(sandboxPID))
	case "PPID":
		return strVar(strconv.Itoa(sandboxPPID))
	case "BASHPID":
		return strVar(strconv.Itoa(sh.pid))
	case "!":
		if sh.lastBg == 0 {
			return expand.Variable{}
		}
		return strVar(strconv.Itoa(sh.lastBg))
	case "-":
		return strVar(sh.opts.flags() + sh.flagC)
	case "0":
		return strVar(sh.arg0)
	case "RANDOM":
		return strVar(strconv.Itoa(int(sh.s.random() % 32768)))
	case "SRANDOM":
		return strVar(strconv.FormatUint(sh.s.random(), 10))
	case "SECONDS":
		return strVar(strconv.Itoa(int(time.Since(sh.s.started) / time.Second)))
	case "LINENO":
		return strVar(strconv.Itoa(sh.lineno))
	case "PWD":
		if vr := sh.vars.get("PWD"); vr.IsSet() && vr.Str == sh.dir {
			return vr
		}
		return expand.Variable{Set: true, Kind: expand.String, Str: sh.dir, Exported: true}
	case "FUNCNAME":
		if len(sh.funcNames) == 0 {
			return expand.Variable{}
		}
		l := slices.Clone(sh.funcNames)
		slices.Reverse(l)
		return expand.Variable{Set: true, Kind: expand.Indexed, List: l}
	case "PIPESTATUS":
		l := make([]string, len(sh.pipeStatus))
		for i, st := range sh.pipeStatus {
			l[i] = strconv.Itoa(st)
		}
		return expand.Variable{Set: true, Kind: expand.Indexed, List: l}
	case "DIRSTACK":
		return expand.Variable{Set: true, Kind: expand.Indexed, List: append([]string{sh.dir}, sh.dirStack...)}
	}
	if len(name) > 0 && name[0] >= '1' && name[0] <= '9' {
		if i, err := strconv.Atoi(name); err == nil {
			if i <= len(sh.params) {
				return strVar(sh.params[i-1])
			}
			return expand.Variable{}
		}
	}
	if user, ok := strings.CutPrefix(name, "HOME "); ok {
		// ~user: only the sandbox's own users have a home; anything else
		// stays as written (never looked up in the host's passwd).
		switch user {
		case sandboxUser, "root":
			return strVar(sandboxHome)
		}
		return strVar("~" + user)
	}
	return sh.vars.get(name)
}

func (e environ) Each(fn func(name string, vr expand.Variable) bool) { e.sh.vars.each(fn) }

func (e environ) Set(name string, vr expand.Variable) error {
	sh := e.sh
	if sh.opts.allexport && vr.IsSet() {
		vr.Exported = true
	}
	if !vr.IsSet() && vr.Kind != expand.KeepValue {
		return sh.vars.unset(name)
	}
	return sh.vars.set(name, vr, false)
}

// cloneVar deep-copies a variable's slices and map, for edits.
func cloneVar(vr expand.Variable) expand.Variable {
	vr.List = slices.Clone(vr.List)
	vr.Indexes = slices.Clone(vr.Indexes)
	if vr.Map != nil {
		vr.Map = maps.Clone(vr.Map)
	}
	return vr
}

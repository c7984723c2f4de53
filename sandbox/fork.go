package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Forker is an optional capability of a Sandbox (find it through wrappers
// with Find): Fork makes n new sandboxes of the same spec holding the same
// files as this one has now — the workdir (which is also the home
// directory) and /tmp — but none of its processes. The sandbox itself goes
// on unchanged. Fork a sandbox no command runs in: a command writing while
// it forks leaves the children with the files as they were at some point
// of the copy.
//
// # Errors
//
// All or nothing: when any of the n cannot be made, the ones made are
// closed and the error is returned, an infrastructure error
// (ErrSandboxFailed, ErrEngineUnavailable) unless the request was bad
// (ErrInvalidSpec for n < 1) or the sandbox broke (ErrClosed,
// ErrSandboxAbuse).
type Forker interface {
	Fork(ctx context.Context, n int) ([]Sandbox, error)
}

// EpisodeNamer is an optional capability of a Sandbox (find it through
// wrappers with Find): NameEpisode says the sandbox now serves the episode
// id. A fork is made with its parent's spec, labels included, so what
// records a sandbox's calls by episode (the audit log) is told which
// episode a fork serves once that is known.
type EpisodeNamer interface {
	NameEpisode(id string)
}

// NameEpisode tells sb, when it (or what it wraps) records calls by
// episode, that it serves episode id.
func NameEpisode(sb Sandbox, id string) {
	if n, ok := Find[EpisodeNamer](sb); ok && id != "" {
		n.NameEpisode(id)
	}
}

// ForkPreparer is an optional capability of a Sandbox that is also a
// Forker: PrepareFork says the sandbox is about to be forked into n (a
// task's prefix is running in it), so the backend may start making the
// children's sandboxes now. A hint: it returns at once, and a Fork without
// it works the same, only colder.
type ForkPreparer interface {
	PrepareFork(n int)
}

// ForkSpareStats is an optional capability of a Backend that keeps fresh
// sandboxes ready for forks (the containerd backend's Options.ForkSpares).
type ForkSpareStats interface {
	ForkStats() ForkStats
}

// ForkStats counts a backend's fork children by where they came from.
type ForkStats struct {
	// SparesReady is how many spares are ready now, all specs together.
	SparesReady int
	// FromSpares and Cold count the children forks took ready and the
	// ones they had to create.
	FromSpares, Cold int64
}

// MaxFork is the most sandboxes one Fork may make.
const MaxFork = 256

// CheckFork refuses an n out of range before anything is made.
func CheckFork(n int) error {
	if n < 1 || n > MaxFork {
		return &FieldError{Field: "n", Message: fmt.Sprintf("%d is not between 1 and %d", n, MaxFork)}
	}
	return nil
}

// CreateAll makes n sandboxes with create, concurrently, all or nothing:
// when one fails, those made are closed and the first error is returned.
func CreateAll(ctx context.Context, n int, create func(ctx context.Context) (Sandbox, error)) ([]Sandbox, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = create(ctx)
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, context.Canceled)) {
			first = err
		}
	}
	if first == nil {
		return out, nil
	}
	CloseAll(out)
	return nil, first
}

// CloseAll closes every sandbox of sbs that is not nil, concurrently.
func CloseAll(sbs []Sandbox) error {
	var wg sync.WaitGroup
	errs := make([]error, len(sbs))
	for i, sb := range sbs {
		if sb == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = sb.Close()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// CopyFiles copies what lies under roots in from into every sandbox of to
// through the file API: regular files with their permission bits
// (ListFiles, ReadFile, WriteFile), directories (even empty ones) with
// theirs, symbolic links and FIFOs (made by mkdir, ln, mkfifo and chmod in
// the target, so ExecRequest must reach shell-less mkdir, ln, mkfifo and
// chmod there). It is how a backend that cannot snapshot a sandbox's files
// forks it.
//
// The files are the sandbox's commands', and hostile: what they left must
// not make the fork fail (the agent would turn the fork into an
// infrastructure failure). A file or directory its owner (the commands'
// user, whom the file API serves) may not read or search is made so in
// from for the copy and given its mode back after, whatever happens;
// sockets and devices (no data to copy; the commands' user cannot make
// devices) are left out; hard links become separate files. Files over
// MaxFileBytes cannot be copied: CopyFiles fails naming the first
// (ErrTooLarge). So does a tree over the copy budget (MaxCopyEntries,
// MaxCopyBytes), found before anything is copied: CopyFiles is PlanCopy,
// then CopyPlan.CopyTo, then CopyPlan.Release.
func CopyFiles(ctx context.Context, from Sandbox, to []Sandbox, roots ...string) (err error) {
	p, err := PlanCopy(ctx, from, roots...)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := p.Release(ctx); rerr != nil && err == nil {
			err = rerr
		}
	}()
	return p.CopyTo(ctx, to)
}

// The copy budget of a fork through the guests (CopyFiles): each entry is
// at least one guest request per child (about 2 ms each on Docker), and the
// sandbox's commands choose how many there are, so a tree over the budget is
// refused before anything is made (ErrTooLarge, the sandbox's doing) rather
// than holding its episode for minutes. Backends that fork copy-on-write
// (containerd under runc, WASM) copy nothing and have no such budget.
const (
	// MaxCopyEntries is the most files, directories, links and FIFOs a
	// copy takes (about 10 s on Docker).
	MaxCopyEntries = 5000
	// MaxCopyBytes is the most bytes of regular files a copy takes.
	MaxCopyBytes int64 = 256 << 20
)

// CopyPlan is what PlanCopy found under the roots of a sandbox: what
// CopyTo copies into others. Release gives the files of the sandbox the
// modes PlanCopy changed for the copy.
type CopyPlan struct {
	from    Sandbox
	files   []string
	links   []copyLink
	dirs    []entry
	fifos   []entry
	restore []entry // modes to give back in from
	modes   map[string]fs.FileMode
	bytes   int64

	released bool
}

type copyLink struct{ path, target string }

// PlanCopy walks what lies under roots in from (see CopyFiles) and
// returns the plan of its copy, checking the copy budget as it goes: a
// tree of more than MaxCopyEntries entries or MaxCopyBytes bytes, or a
// file over MaxFileBytes, fails at once with ErrTooLarge, its walk
// stopped there (so at most MaxCopyEntries entries are listed) and from
// left as it was.
func PlanCopy(ctx context.Context, from Sandbox, roots ...string) (_ *CopyPlan, err error) {
	p := &CopyPlan{from: from, modes: map[string]fs.FileMode{}}
	defer func() {
		if err != nil {
			if rerr := p.Release(ctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	entries := 0
	// open makes what a listing holds readable (files) or searchable
	// (directories) by its owner in from, one chmod for the lot.
	open := func(perm string, es []entry) error {
		if len(es) == 0 {
			return nil
		}
		var paths []string
		for _, e := range es {
			paths = append(paths, e.path)
		}
		if err := runEach(ctx, from, []string{"chmod", perm, "--"}, paths); err != nil {
			return err
		}
		p.restore = append(p.restore, es...)
		return nil
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		list, err := from.ListFiles(ctx, dir)
		if err != nil {
			return fmt.Errorf("fork: list %s: %w", dir, err)
		}
		entries += len(list)
		if entries > MaxCopyEntries {
			return fmt.Errorf("fork: the sandbox holds more than %d files, directories and links under %s, the most a fork copies through the guests (a backend that forks copy-on-write has no such limit: containerd under runc, wasm): %w",
				MaxCopyEntries, strings.Join(roots, " and "), ErrTooLarge)
		}
		var shutDirs, lockedFiles []entry
		var subdirs []string
		for _, fi := range list {
			fp := path.Join(dir, fi.Name)
			switch {
			case fi.IsDir:
				p.dirs = append(p.dirs, entry{fp, fi.Mode, true})
				subdirs = append(subdirs, fp)
				if fi.Mode.Perm()&0o500 != 0o500 {
					shutDirs = append(shutDirs, entry{fp, fi.Mode, true})
				}
			case fi.Link != "" || fi.Mode&fs.ModeSymlink != 0:
				p.links = append(p.links, copyLink{fp, fi.Link})
			case fi.Mode.IsRegular():
				if fi.Size > MaxFileBytes {
					return fmt.Errorf("fork: %s has %d bytes, over the %d a file can be copied with: %w", fp, fi.Size, MaxFileBytes, ErrTooLarge)
				}
				p.bytes += fi.Size
				if p.bytes > MaxCopyBytes {
					return fmt.Errorf("fork: the sandbox's files under %s hold more than %d bytes, the most a fork copies through the guests (a backend that forks copy-on-write has no such limit: containerd under runc, wasm): %w",
						strings.Join(roots, " and "), MaxCopyBytes, ErrTooLarge)
				}
				p.files = append(p.files, fp)
				p.modes[fp] = fi.Mode.Perm()
				if fi.Mode.Perm()&0o400 == 0 {
					lockedFiles = append(lockedFiles, entry{fp, fi.Mode, false})
				}
			case fi.Mode&fs.ModeNamedPipe != 0:
				p.fifos = append(p.fifos, entry{fp, fi.Mode, false})
			default:
				// A socket or a device: nothing to copy.
			}
		}
		if err := open("u+rx", shutDirs); err != nil {
			return err
		}
		if err := open("u+r", lockedFiles); err != nil {
			return err
		}
		for _, d := range subdirs {
			if err := walk(d); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range roots {
		if err := walk(r); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Release gives the files of the planned sandbox the modes PlanCopy
// changed for the copy. Once; later calls do nothing.
func (p *CopyPlan) Release(ctx context.Context) error {
	if p.released {
		return nil
	}
	p.released = true
	if err := chmodAll(ctx, p.from, p.restore); err != nil {
		return fmt.Errorf("fork: give the files their modes back: %w", err)
	}
	return nil
}

// CopyTo copies the planned files into every sandbox of to (see
// CopyFiles), reading each file of the planned sandbox once.
func (p *CopyPlan) CopyTo(ctx context.Context, to []Sandbox) error {
	run := func(sb Sandbox, argv ...string) error { return runArgv(ctx, sb, argv...) }
	each := func(f func(sb Sandbox) error) error {
		errs := make([]error, len(to))
		var wg sync.WaitGroup
		for i, sb := range to {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = f(sb) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if len(p.dirs) > 0 {
		var paths []string
		for _, d := range p.dirs {
			paths = append(paths, d.path)
		}
		if err := each(func(sb Sandbox) error { return runEach(ctx, sb, []string{"mkdir", "-p", "--"}, paths) }); err != nil {
			return err
		}
	}
	for _, fp := range p.files {
		data, err := p.from.ReadFile(ctx, fp, MaxFileBytes)
		if err != nil {
			return fmt.Errorf("fork: %w", err)
		}
		mode := p.modes[fp]
		if err := each(func(sb Sandbox) error { return sb.WriteFile(ctx, fp, data, mode) }); err != nil {
			return fmt.Errorf("fork: %w", err)
		}
	}
	for _, l := range p.links {
		if err := each(func(sb Sandbox) error { return run(sb, "ln", "-sfn", "--", l.target, l.path) }); err != nil {
			return err
		}
	}
	for _, f := range p.fifos {
		if err := each(func(sb Sandbox) error {
			return run(sb, "mkfifo", "-m", fmt.Sprintf("%o", f.mode.Perm()), "--", f.path)
		}); err != nil {
			return err
		}
	}
	// The directories' modes last, once nothing more is written into them.
	return each(func(sb Sandbox) error { return chmodAll(ctx, sb, p.dirs) })
}

// entry is a path of a sandbox with its mode.
type entry struct {
	path string
	mode fs.FileMode
	dir  bool
}

// runArgv runs argv in sb, an error unless it exits 0.
func runArgv(ctx context.Context, sb Sandbox, argv ...string) error {
	r, err := sb.Exec(ctx, ExecRequest{Argv: argv})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("fork: %s exited %d: %s: %w", argv[0], r.ExitCode, r.Stderr, ErrSandboxFailed)
	}
	return nil
}

// chmodAll gives every entry its mode in sb with as few chmods as it can:
// the files first, then the directories deepest first (a directory
// closed to its owner before what is in it got its mode would stop the
// chmods below it).
func chmodAll(ctx context.Context, sb Sandbox, es []entry) error {
	type key struct {
		depth int
		mode  fs.FileMode
	}
	groups := map[key][]string{}
	for _, e := range es {
		k := key{-1, e.mode.Perm() | unixSpecial(e.mode)}
		if e.dir {
			k.depth = strings.Count(path.Clean(e.path), "/")
		}
		groups[k] = append(groups[k], e.path)
	}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if (a.depth < 0) != (b.depth < 0) {
			return a.depth < 0 // files first
		}
		if a.depth != b.depth {
			return a.depth > b.depth
		}
		return a.mode < b.mode
	})
	for _, k := range keys {
		if err := runEach(ctx, sb, []string{"chmod", fmt.Sprintf("%o", k.mode), "--"}, groups[k]); err != nil {
			return err
		}
	}
	return nil
}

// runEach runs argv with paths appended, a thousand at a time.
func runEach(ctx context.Context, sb Sandbox, argv, paths []string) error {
	for len(paths) > 0 {
		n := min(len(paths), 1000)
		if err := runArgv(ctx, sb, append(slices.Clone(argv), paths[:n]...)...); err != nil {
			return err
		}
		paths = paths[n:]
	}
	return nil
}

// unixSpecial is the setuid, setgid and sticky bits of m as the bits of a
// numeric chmod mode.
func unixSpecial(m fs.FileMode) fs.FileMode {
	var out fs.FileMode
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

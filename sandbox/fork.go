package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
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
// (ListFiles, ReadFile, WriteFile), directories (even empty ones) and
// symbolic links (made by mkdir and ln in the target, so ExecRequest must
// reach a shell-less mkdir and ln there). It is how a backend that cannot
// snapshot a sandbox's files forks it. Files over MaxFileBytes, FIFOs,
// sockets and devices are not copied: CopyFiles fails naming the first.
func CopyFiles(ctx context.Context, from Sandbox, to []Sandbox, roots ...string) error {
	var files []string
	var dirs []string
	type link struct{ path, target string }
	var links []link
	modes := map[string]fs.FileMode{}
	var walk func(dir string) error
	walk = func(dir string) error {
		list, err := from.ListFiles(ctx, dir)
		if err != nil {
			return fmt.Errorf("fork: list %s: %w", dir, err)
		}
		for _, fi := range list {
			p := path.Join(dir, fi.Name)
			switch {
			case fi.IsDir:
				dirs = append(dirs, p)
				if err := walk(p); err != nil {
					return err
				}
			case fi.Link != "" || fi.Mode&fs.ModeSymlink != 0:
				links = append(links, link{p, fi.Link})
			case fi.Mode.IsRegular():
				if fi.Size > MaxFileBytes {
					return fmt.Errorf("fork: %s has %d bytes, over the %d a file can be copied with: %w", p, fi.Size, MaxFileBytes, ErrTooLarge)
				}
				files = append(files, p)
				modes[p] = fi.Mode.Perm()
			default:
				return fmt.Errorf("fork: %s is a %v, which cannot be copied: %w", p, fi.Mode.Type(), ErrInvalidSpec)
			}
		}
		return nil
	}
	for _, r := range roots {
		if err := walk(r); err != nil {
			return err
		}
	}
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
	run := func(sb Sandbox, argv ...string) error {
		r, err := sb.Exec(ctx, ExecRequest{Argv: argv})
		if err != nil {
			return err
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("fork: %s exited %d: %s: %w", argv[0], r.ExitCode, r.Stderr, ErrSandboxFailed)
		}
		return nil
	}
	if len(dirs) > 0 {
		if err := each(func(sb Sandbox) error { return run(sb, append([]string{"mkdir", "-p", "--"}, dirs...)...) }); err != nil {
			return err
		}
	}
	for _, p := range files {
		data, err := from.ReadFile(ctx, p, MaxFileBytes)
		if err != nil {
			return fmt.Errorf("fork: %w", err)
		}
		mode := modes[p]
		if err := each(func(sb Sandbox) error { return sb.WriteFile(ctx, p, data, mode) }); err != nil {
			return fmt.Errorf("fork: %w", err)
		}
	}
	for _, l := range links {
		if err := each(func(sb Sandbox) error { return run(sb, "ln", "-sfn", "--", l.target, l.path) }); err != nil {
			return err
		}
	}
	return nil
}

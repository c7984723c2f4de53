package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// Bounds on reading the agent's workspace out of its sandbox. A workspace
// past MaxEntries, MaxFiles or MaxBytes is not verified: the episode scores
// 0, blamed on what the agent left. Files over MaxFileBytes and directories
// deeper than MaxDepth are skipped (recorded), never followed.
const (
	MaxEntries   = 50000
	MaxFiles     = 10000
	MaxBytes     = 128 << 20
	MaxFileBytes = 8 << 20
	MaxDepth     = 32
	// maxSkipRecords bounds the skips kept in the record.
	maxSkipRecords = 200
	// Files no reward takes from the agent (protected tests, runner
	// configuration) are read too, apart from the bounds above, to see
	// whether the agent changed or planted them (the test_tampering
	// monitor, the workspace diff): the task's own files up to
	// MaxFileBytes, new ones up to maxPlantedBytes; at most maxExtraReads
	// files and maxExtraBytes in all.
	maxPlantedBytes = 64 << 10
	maxExtraReads   = 200
	maxExtraBytes   = 4 << 20
)

// agentFile is a regular file of the agent's workspace that differs from
// the task's (or that the task did not have). extra marks one that no
// reward takes (read to be compared and shown).
type agentFile struct {
	data  []byte
	mode  fs.FileMode
	extra bool
}

// snapshot is what was read of the agent's workspace: every directory
// listed, the regular files that differ from the task's, and what was
// skipped. Blame is set when the workspace is past the bounds.
type snapshot struct {
	workdir string
	listed  map[string]map[string]sandbox.FileInfo
	files   map[string]agentFile
	skipped []trajectory.Skip
	skips   int // all skips, kept or not
	blame   string
	dur     time.Duration
}

func (s *snapshot) skip(p, kind, reason string) {
	s.skips++
	if len(s.skipped) < maxSkipRecords {
		s.skipped = append(s.skipped, trajectory.Skip{Path: p, Reason: reason, Kind: kind})
	}
}

// wantFn says whether a path of the workspace may be taken from the agent
// by some tests reward (so it is worth reading), and for a directory
// whether something below it may be.
type wantFn func(p string, dir bool) bool

// kindFn classifies a path no reward takes (trajectory.Skip kinds).
type kindFn func(p string, fromTask bool) string

// collect walks the agent's workdir breadth-first through the sandbox's
// file API (never a command), reading the regular files want accepts. It
// follows no symlink and opens no special file. An error is a failure of
// the sandbox (infrastructure or abuse), not of what the agent left.
func collect(ctx context.Context, sb Sandbox, workdir string, task map[string][]byte, want wantFn, kind kindFn) (*snapshot, error) {
	start := time.Now()
	s := &snapshot{workdir: workdir, listed: map[string]map[string]sandbox.FileInfo{}, files: map[string]agentFile{}}
	defer func() { s.dur = time.Since(start) }()
	type item struct {
		dir   string
		depth int
	}
	taskDirs := map[string]bool{}
	for p := range task {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			taskDirs[d] = true
		}
	}
	queue := []item{{workdir, 0}}
	var reads []readJob
	entries, nfiles, extras := 0, 0, 0
	var nbytes, extraBytes int64
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		fis, err := sb.ListFiles(ctx, it.dir)
		if err != nil {
			if errors.Is(err, sandbox.ErrNotFound) && it.dir != workdir {
				s.skip(it.dir, trajectory.SkipOther, "removed while the workspace was read")
				continue
			}
			if failed(ctx, err) {
				return nil, fmt.Errorf("list %s of the agent's workspace: %w", it.dir, err)
			}
			s.skip(it.dir, trajectory.SkipOther, "directory not readable: "+err.Error())
			continue
		}
		m := make(map[string]sandbox.FileInfo, len(fis))
		s.listed[it.dir] = m
		for _, fi := range fis {
			m[fi.Name] = fi
			if entries++; entries > MaxEntries {
				s.blame = fmt.Sprintf("the workspace has more than %d entries (files and directories), more than the verifier reads", MaxEntries)
				return s, nil
			}
			p := path.Join(it.dir, fi.Name)
			_, fromTask := task[p]
			switch {
			case fi.Link != "" || fi.Mode&fs.ModeSymlink != 0:
				s.skip(p, trajectory.SkipUnsafe, fmt.Sprintf("a symlink (to %q): never followed or copied", fi.Link))
			case fi.IsDir:
				if !want(p, true) && !taskDirs[p] {
					s.skip(p, kind(p, false), "a directory the verifier takes from the task (tests or runner files), not from the agent")
					continue
				}
				if it.depth+1 > MaxDepth {
					s.skip(p, trajectory.SkipBound, fmt.Sprintf("deeper than %d directories: not read", MaxDepth))
					continue
				}
				// A directory of the task's no reward takes from is listed
				// too: its files are compared with the task's.
				queue = append(queue, item{p, it.depth + 1})
			case !fi.Mode.IsRegular():
				if want(p, false) || !fromTask {
					s.skip(p, trajectory.SkipUnsafe, fmt.Sprintf("not a regular file (%v): not copied", fi.Mode.Type()))
				}
			case !want(p, false):
				// Not taken from the agent: read to see whether it was
				// changed (the task's) or planted (new), within bounds of
				// their own; the plan records it when it differs.
				limit := int64(maxPlantedBytes)
				if fromTask {
					limit = MaxFileBytes
				}
				if fi.Size > limit || extras >= maxExtraReads || extraBytes+fi.Size > maxExtraBytes {
					if !fromTask || int64(len(task[p])) != fi.Size {
						s.skip(p, kind(p, fromTask), fmt.Sprintf("a protected test or runner file: the verifier uses the task's version (%d bytes, not read)", fi.Size))
					}
					continue
				}
				extras++
				extraBytes += fi.Size
				reads = append(reads, readJob{path: p, mode: fi.Mode.Perm(), extra: true})
				continue
			case fi.Size > MaxFileBytes:
				s.skip(p, trajectory.SkipBound, fmt.Sprintf("%d bytes, over the %d-byte cap of a copied file", fi.Size, MaxFileBytes))
			case fromTask && int64(len(task[p])) == fi.Size && fi.Size == 0:
				// an empty file left empty
			default:
				if nfiles++; nfiles > MaxFiles {
					s.blame = fmt.Sprintf("the workspace has more than %d files to compare with the task's, more than the verifier reads", MaxFiles)
					return s, nil
				}
				if nbytes += fi.Size; nbytes > MaxBytes {
					s.blame = fmt.Sprintf("the workspace holds more than %d bytes of files, more than the verifier reads", MaxBytes)
					return s, nil
				}
				reads = append(reads, readJob{path: p, mode: fi.Mode.Perm()})
			}
		}
	}
	return s, s.read(ctx, sb, task, reads)
}

type readJob struct {
	path  string
	mode  fs.FileMode
	extra bool
}

// readers is how many files are read out at once: one round trip each to
// the sandbox's guest, which serves requests concurrently.
const readers = 8

// read reads the files of jobs, keeping those that differ from the task's.
func (s *snapshot) read(ctx context.Context, sb Sandbox, task map[string][]byte, jobs []readJob) error {
	type result struct {
		data []byte
		err  error
	}
	results := make([]result, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(readers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				data, err := sb.ReadFile(rctx, jobs[i].path, MaxFileBytes)
				results[i] = result{data, err}
				if err != nil && failed(rctx, err) {
					cancel()
				}
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-rctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	for i, r := range results {
		if r.err != nil && failed(ctx, r.err) && !(errors.Is(r.err, context.Canceled) && ctx.Err() == nil) {
			return fmt.Errorf("read %s of the agent's workspace: %w", jobs[i].path, r.err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, j := range jobs {
		r := results[i]
		if r.err != nil {
			s.skip(j.path, trajectory.SkipOther, "not readable: "+r.err.Error())
			continue
		}
		if old, fromTask := task[j.path]; fromTask && bytes.Equal(r.data, old) {
			continue
		}
		s.files[j.path] = agentFile{data: r.data, mode: j.mode, extra: j.extra}
	}
	return nil
}

// failed reports whether err is the sandbox failing (or the context
// ending) rather than one path's trouble.
func failed(ctx context.Context, err error) bool {
	return ctx.Err() != nil || sandbox.IsInfra(err) || sandbox.IsAbuse(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// presence says what the agent's workspace has at p, a task file's path:
// "file" (a regular file), "absent" (deleted), "unknown" (a directory on
// the way was not read) or a reason it is neither.
func (s *snapshot) presence(p string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, s.workdir), "/")
	cur := s.workdir
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		entries, ok := s.listed[cur]
		if !ok {
			return "unknown"
		}
		fi, ok := entries[c]
		if !ok {
			return "absent"
		}
		if i == len(comps)-1 {
			switch {
			case fi.Link != "" || fi.Mode&fs.ModeSymlink != 0:
				return "a symlink"
			case fi.IsDir:
				return "a directory"
			case !fi.Mode.IsRegular():
				return "not a regular file"
			}
			return "file"
		}
		if fi.IsDir && fi.Link == "" {
			cur = path.Join(cur, c)
			continue
		}
		return path.Join(cur, c) + " is not a directory"
	}
	return "unknown"
}

// sortedFiles lists the snapshot's files in path order.
func (s *snapshot) sortedFiles() []string {
	out := make([]string, 0, len(s.files))
	for p := range s.files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

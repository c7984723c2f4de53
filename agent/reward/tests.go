package reward

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/rollbox/rollbox/agent/reward/testreport"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

// workspace reads the agent's files once, then closes its sandbox.
type workspace struct {
	specs []Spec
	// diff: a judge sees the workspace's diff, so the files any task's
	// selection would take are read even without a tests reward.
	diff  bool
	done  bool
	snap  *snapshot
	err   error
	wdiff *trajectory.WorkspaceDiff
}

// selections are the tests rewards' selections (a default one when a
// judge alone reads the workspace).
func (w *workspace) selections(workdir string) []selection {
	var sels []selection
	for _, s := range w.specs {
		sels = append(sels, newSelection(s, workdir))
	}
	if w.diff || len(sels) == 0 {
		sels = append(sels, newSelection(Spec{Type: "tests"}, workdir))
	}
	return sels
}

// workspaceDiff reads the workspace (if not yet) and returns its diff
// against the task's files; nil when the workspace was past the bounds.
func (w *workspace) workspaceDiff(ctx context.Context, in Input) (*trajectory.WorkspaceDiff, error) {
	snap, err := w.read(ctx, in, func() error {
		if in.NewSandbox == nil {
			return errors.New("no way to make a fresh sandbox")
		}
		sb, err := in.NewSandbox(ctx)
		if err == nil {
			sb.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if w.wdiff == nil && snap.blame == "" {
		w.wdiff = diffOf(snap, in.TaskFiles, in.Workdir)
	}
	return w.wdiff, nil
}

// read returns the snapshot of the agent's workspace, reading it on the
// first call. The agent's sandbox is closed afterwards, whatever happened.
//
// fresh reports whether a fresh sandbox of the spec starts (nil) or not:
// asked only when the agent's sandbox failed, to tell whose failure it is.
func (w *workspace) read(ctx context.Context, in Input, fresh func() error) (*snapshot, error) {
	if w.done {
		return w.snap, w.err
	}
	w.done = true
	if in.CloseSandbox != nil {
		defer in.CloseSandbox()
	}
	if in.Sandbox == nil || in.NewSandbox == nil {
		w.err = errors.New("a tests reward needs the episode's sandbox and a way to make a fresh one")
		return nil, w.err
	}
	sels := w.selections(in.Workdir)
	want := func(p string, dir bool) bool {
		for _, sel := range sels {
			if sel.want(p, dir) {
				return true
			}
		}
		return false
	}
	var err error
	for try := 0; try < 2; try++ {
		w.snap, err = collect(ctx, in.Sandbox, in.Workdir, in.TaskFiles, want, sels[0].kind)
		if err == nil || sandbox.IsAbuse(err) || ctx.Err() != nil {
			break
		}
	}
	switch {
	case err == nil:
	case sandbox.IsAbuse(err) || ctx.Err() != nil:
		w.err = err
	default:
		// The agent's sandbox failed while its files were read, twice. If
		// the infrastructure cannot make a fresh sandbox either, that is
		// its failure; if it can, the episode's own sandbox broke under
		// what the episode left running in it.
		if ferr := fresh(); ferr != nil {
			w.err = fmt.Errorf("reading the agent's workspace: %v; %w", err, ferr)
			break
		}
		w.err = fmt.Errorf("the episode's sandbox failed while the verifier read its workspace (%v), while a fresh sandbox of the same spec works: %w", err, sandbox.ErrSandboxAbuse)
	}
	return w.snap, w.err
}

// tests verifies in a clean room: the agent's files are read out of its
// sandbox (bounded, as data), the sandbox is closed, and the command runs
// in a fresh sandbox holding the task's files, the agent's changes that
// the reward takes, and the hidden tests.
func tests(ctx context.Context, s Spec, in Input) (*trajectory.Reward, error) {
	v := &trajectory.Verifier{Command: s.Command, CleanRoom: true}
	r := &trajectory.Reward{Total: trajectory.Score(0), Components: map[string]float64{"tests": 0}, Verifier: v}
	var ahead <-chan prepared
	if in.NewSandbox != nil {
		ahead = prepare(ctx, in) // made while the agent's files are read
	}
	var made *prepared
	take := func() *prepared {
		if made == nil && ahead != nil {
			p := <-ahead
			made, ahead = &p, nil
		}
		return made
	}
	defer func() { // not used: close it
		if p := take(); p != nil && p.sb != nil {
			p.sb.Close()
		}
	}()
	snap, err := in.ws.read(ctx, in, func() error {
		if p := take(); p != nil {
			return p.err
		}
		return errors.New("no verifier sandbox was made")
	})
	if err != nil {
		return nil, err
	}
	v.CollectMS = float64(snap.dur) / float64(time.Millisecond)
	v.Skipped = append(v.Skipped, snap.skipped...)
	if snap.skips > len(snap.skipped) {
		v.Skipped = append(v.Skipped, trajectory.Skip{Path: in.Workdir, Kind: trajectory.SkipBound, Reason: fmt.Sprintf("... and %d more skipped paths not listed", snap.skips-len(snap.skipped))})
	}
	if snap.blame != "" {
		return blamed(r, snap.blame), nil
	}
	if in.ws.wdiff == nil {
		in.ws.wdiff = diffOf(snap, in.TaskFiles, in.Workdir)
	}
	r.Workspace = in.ws.wdiff
	pl := planFor(s, in, snap)
	v.Deleted = pl.deleted
	v.Skipped = append(v.Skipped, pl.skipped...)
	for _, f := range pl.hidden {
		v.Added = append(v.Added, f.Path)
	}
	sort.Strings(v.Added)
	var rn *run
	for try := 0; try < 2; try++ {
		var first *prepared
		if try == 0 {
			first = take()
			made = &prepared{} // handed over: runOnce closes it
		}
		rn, err = runOnce(ctx, s, in, pl, true, &v.Attempts, first)
		var re errRetry
		if err == nil || !errors.As(err, &re) {
			break
		}
	}
	var re errRetry
	if errors.As(err, &re) {
		// The verifier's sandbox failed twice with the agent's files in it.
		// A control run of the task's files alone tells whose failure it is.
		_, cerr := runOnce(ctx, s, in, pl, false, &v.Attempts, nil)
		if cerr == nil {
			return nil, fmt.Errorf("the verifier's sandbox failed twice with the agent's files in it (%v) and not without them: %w", err, sandbox.ErrSandboxAbuse)
		}
		return nil, fmt.Errorf("the verifier's sandbox failed with the agent's files (%v) and without them: %w", err, cerr)
	}
	if err != nil {
		return nil, err
	}
	v.Copied = rn.copied
	v.Skipped = append(v.Skipped, rn.skipped...)
	if rn.blame != "" {
		return blamed(r, rn.blame), nil
	}
	res := rn.res
	v.ExitCode, v.TimedOut = res.ExitCode, res.TimedOut
	v.Stdout, v.Stderr = trajectory.NewBytes(capped(res.Stdout, in.VerifierOutputCap)), trajectory.NewBytes(capped(res.Stderr, in.VerifierOutputCap))
	v.DurationMS = float64(res.Duration) / float64(time.Millisecond)
	total, details := score(s, rn, v)
	r.Total = trajectory.Score(total)
	r.Components["tests"] = total
	if rn.report != nil && rn.report.Score != nil {
		for k, x := range rn.report.Scores {
			r.Components["harbor."+k] = x
		}
	}
	r.Details = append(r.Details, details...)
	return r, nil
}

func blamed(r *trajectory.Reward, why string) *trajectory.Reward {
	r.Total = trajectory.Score(0)
	r.Verifier.Blame = why
	r.Details = append(r.Details, "scored 0 without running the tests: "+why)
	return r
}

// capped keeps the head and the tail of b within limit bytes.
func capped(b []byte, limit int) []byte {
	if limit <= 0 || len(b) <= limit {
		return b
	}
	c := sandbox.NewCapture(limit)
	c.Write(b)
	return c.Bytes()
}

// maxNamesRecorded bounds the missing and failing test names kept.
const maxNamesRecorded = 50

func capNames(names []string) []string {
	if len(names) <= maxNamesRecorded {
		return names
	}
	return append(names[:maxNamesRecorded:maxNamesRecorded], fmt.Sprintf("... and %d more", len(names)-maxNamesRecorded))
}

// score turns a run into a reward: named test results when the reward has
// a report (or runs pytest), the exit status otherwise.
func score(s Spec, rn *run, v *trajectory.Verifier) (float64, []string) {
	res := rn.res
	if res.TimedOut {
		return 0, []string{"the verifier timed out"}
	}
	if rn.report == nil && rn.repErr == nil {
		// Exit-status scoring: anything that makes the command exit 0 passes.
		if res.ExitCode == 0 && !res.OOMKilled {
			return 1, nil
		}
		return 0, []string{fmt.Sprintf("the verifier exited %d", res.ExitCode)}
	}
	if rn.repErr != nil {
		v.Blame = rn.repErr.Error()
		return 0, []string{"no usable test report: " + rn.repErr.Error()}
	}
	rep := rn.report
	v.Report = rep.Format
	if rep.Score != nil {
		// The runner's own score (Harbor's reward file); its exit status
		// does not count, as in Harbor.
		return *rep.Score, nil
	}
	c := rep.Counts()
	v.Tests = &trajectory.TestCounts{Total: c.Total, Passed: c.Passed, Failed: c.Failed, Skipped: c.Skipped}
	if !rep.Complete {
		v.Blame = "the run did not finish: " + rep.Problem
		return 0, []string{"incomplete test report: " + rep.Problem}
	}
	if s.Report == nil {
		// pytest under an exit-status reward: the exit status must be 0 and
		// pytest's own report must show every test it ran passed.
		switch {
		case res.ExitCode != 0:
			return 0, []string{fmt.Sprintf("the verifier exited %d", res.ExitCode)}
		case c.Total == 0:
			return 0, []string{"pytest reported no test"}
		case c.Passed != c.Total:
			v.Failing = capNames(rep.NotPassed())
			return 0, []string{fmt.Sprintf("pytest exited 0 but reported %d of %d tests not passed", c.Total-c.Passed, c.Total)}
		}
		return 1, nil
	}
	for _, name := range s.MustFail {
		for _, k := range rep.Lookup(name) {
			if k.Status == testreport.Passed {
				v.Blame = fmt.Sprintf("the report says the canary test %s passed, which fails whatever the agent did: the report was forged in the test process", k.Name)
				return 0, []string{"a forged test report: " + v.Blame}
			}
		}
	}
	if len(s.MustPass) > 0 {
		var missing, failing []string
		passed := 0
		for _, name := range s.MustPass {
			cases := rep.Lookup(name)
			if len(cases) == 0 {
				missing = append(missing, name)
				continue
			}
			ok := true
			for _, k := range cases {
				if k.Status != testreport.Passed {
					ok = false
					failing = append(failing, k.Name+" ("+string(k.Status)+")")
				}
			}
			if ok {
				passed++
			}
		}
		v.Missing, v.Failing = capNames(missing), capNames(failing)
		if len(missing) > 0 {
			return 0, []string{fmt.Sprintf("%d of the %d tests that must pass are missing from the report", len(missing), len(s.MustPass))}
		}
		if s.Score == ScoreFraction {
			return float64(passed) / float64(len(s.MustPass)), nil
		}
		if passed == len(s.MustPass) {
			return 1, nil
		}
		return 0, []string{fmt.Sprintf("%d of the %d tests that must pass did not", len(s.MustPass)-passed, len(s.MustPass))}
	}
	v.Failing = capNames(rep.NotPassed())
	if c.Total == 0 {
		return 0, []string{"the report names no test"}
	}
	if s.Score == ScoreFraction {
		return float64(c.Passed) / float64(c.Total), nil
	}
	if c.Passed == c.Total {
		return 1, nil
	}
	return 0, []string{fmt.Sprintf("%d of %d tests did not pass", c.Total-c.Passed, c.Total)}
}

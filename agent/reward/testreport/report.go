package testreport

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Formats a report may have.
const (
	JUnit      = "junit"
	Pytest     = "pytest" // pytest's own JUnit XML, asked for by the verifier
	GoTestJSON = "go-test-json"
	TAP        = "tap"
	// Harbor: the reward files a Harbor (Terminal-Bench) test script
	// writes, read from a directory (see ParseHarbor). They name no test.
	Harbor = "harbor"
)

// Formats lists every format, for validation messages.
var Formats = []string{JUnit, Pytest, GoTestJSON, TAP, Harbor}

// Status of one test.
type Status string

// Statuses. Anything but Passed is not a pass.
const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	Skipped Status = "skipped"
	// Unfinished: the test started and never reported an end (the runner
	// died or exited under it).
	Unfinished Status = "unfinished"
)

// Case is one test the report names.
type Case struct {
	// Name is the test's canonical name: a pytest node id
	// ("tests/test_calc.py::TestAdd::test_neg"), "pkg.TestName/sub" for Go,
	// the description of a TAP line, "classname::name" for other JUnit.
	Name string
	// Aliases are other names the test may be given by (must_pass entries
	// match Name or any alias).
	Aliases []string
	Status  Status
}

// Report is what a runner reported.
type Report struct {
	Format string
	Cases  []Case
	// Complete is false when the report shows the run did not reach its
	// end (no TAP plan or fewer results than planned, a Go package without
	// its final event, a bail-out).
	Complete bool
	// Problem says why the report is incomplete.
	Problem string
	// Score, when set, is the runner's own score (Harbor's reward): the
	// reward is it, not a count of cases. Scores are the runner's other
	// named numbers.
	Score  *float64
	Scores map[string]float64
}

// MaxCases bounds the tests one report may name.
const MaxCases = 100000

// ErrMalformed wraps a report that cannot be read at all.
var ErrMalformed = errors.New("malformed test report")

// Parse reads data in format.
func Parse(format string, data []byte) (*Report, error) {
	switch format {
	case JUnit, Pytest:
		return parseJUnit(format, data)
	case GoTestJSON:
		return parseGoJSON(data)
	case TAP:
		return parseTAP(data)
	case Harbor:
		return ParseHarbor(nil, data)
	}
	return nil, fmt.Errorf("test report format %q is not one of %s", format, strings.Join(Formats, ", "))
}

// Counts are a report's totals.
type Counts struct {
	Total, Passed, Failed, Skipped int
}

// Counts totals the cases by status (unfinished counts as failed).
func (r *Report) Counts() Counts {
	var c Counts
	for _, k := range r.Cases {
		c.Total++
		switch k.Status {
		case Passed:
			c.Passed++
		case Skipped:
			c.Skipped++
		default:
			c.Failed++
		}
	}
	return c
}

// Lookup finds the cases a name matches (by name or alias).
func (r *Report) Lookup(name string) []Case {
	var out []Case
	for _, c := range r.Cases {
		if c.Name == name {
			out = append(out, c)
			continue
		}
		for _, a := range c.Aliases {
			if a == name {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// NotPassed lists the names of the cases that did not pass, sorted.
func (r *Report) NotPassed() []string {
	var out []string
	for _, c := range r.Cases {
		if c.Status != Passed {
			out = append(out, c.Name+" ("+string(c.Status)+")")
		}
	}
	sort.Strings(out)
	return out
}

package testreport

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// parseTAP reads a TAP stream: "1..N" (the plan, first or last), then
// "ok N - description" or "not ok N - description", with "# SKIP" and
// "# TODO" directives. Lines that are neither are ignored (diagnostics,
// other output). Without a plan, with fewer or more results than planned,
// or after "Bail out!", the report is incomplete.
func parseTAP(data []byte) (*Report, error) {
	r := &Report{Format: TAP, Complete: true}
	plan := -1
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	bailed := ""
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.HasPrefix(line, "1.."):
			n, err := strconv.Atoi(strings.Fields(line[3:] + " x")[0])
			if err != nil || n < 0 {
				continue
			}
			if plan >= 0 {
				r.Complete, r.Problem = false, "more than one plan line"
			}
			plan = n
		case strings.HasPrefix(line, "Bail out!"):
			bailed = strings.TrimSpace(strings.TrimPrefix(line, "Bail out!"))
		case strings.HasPrefix(line, "ok") || strings.HasPrefix(line, "not ok"):
			st := Passed
			rest := strings.TrimPrefix(line, "ok")
			if strings.HasPrefix(line, "not ok") {
				st, rest = Failed, strings.TrimPrefix(line, "not ok")
			}
			if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
				continue // "okay ..." is not a result
			}
			rest = strings.TrimSpace(rest)
			num := ""
			if i := strings.IndexFunc(rest, func(c rune) bool { return c < '0' || c > '9' }); i != 0 {
				if i < 0 {
					i = len(rest)
				}
				num, rest = rest[:i], strings.TrimSpace(rest[i:])
			}
			desc, directive, _ := strings.Cut(rest, "#")
			desc = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(desc), "-"))
			d := strings.ToUpper(strings.TrimSpace(directive))
			switch {
			case strings.HasPrefix(d, "SKIP"):
				st = Skipped
			case strings.HasPrefix(d, "TODO"):
				st = Skipped // a TODO test's result does not count either way
			}
			if len(r.Cases) >= MaxCases {
				return nil, fmt.Errorf("TAP report: more than %d results: %w", MaxCases, ErrMalformed)
			}
			if num == "" {
				num = strconv.Itoa(len(r.Cases) + 1)
			}
			name := desc
			if name == "" {
				name = num
			}
			r.Cases = append(r.Cases, Case{Name: name, Aliases: []string{num}, Status: st})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("TAP report: %v: %w", err, ErrMalformed)
	}
	switch {
	case bailed != "" || strings.Contains(string(data), "\nBail out!") || bytes.HasPrefix(data, []byte("Bail out!")):
		r.Complete, r.Problem = false, "the run bailed out: "+bailed
	case plan < 0:
		r.Complete, r.Problem = false, "no plan line (1..N): the run may have stopped early"
	case plan != len(r.Cases):
		r.Complete, r.Problem = false, fmt.Sprintf("%d result(s) for a plan of %d", len(r.Cases), plan)
	}
	return r, nil
}

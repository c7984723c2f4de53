package testreport

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

type goEvent struct {
	Action  string
	Package string
	Test    string
}

// parseGoJSON reads `go test -json` events (one JSON object a line; other
// lines, such as build output, are ignored). A test that ran and never
// ended is Unfinished; a package without its final pass or fail makes the
// report incomplete.
func parseGoJSON(data []byte) (*Report, error) {
	r := &Report{Format: GoTestJSON, Complete: true}
	type key struct{ pkg, test string }
	status := map[key]Status{}
	var order []key
	pkgs := map[string]bool{} // package → ended
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	events := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var ev goEvent
		if json.Unmarshal(line, &ev) != nil || ev.Action == "" {
			continue
		}
		events++
		if ev.Package == "" {
			continue
		}
		if _, ok := pkgs[ev.Package]; !ok {
			pkgs[ev.Package] = false
		}
		if ev.Test == "" {
			switch ev.Action {
			case "pass", "fail", "skip":
				pkgs[ev.Package] = true
			}
			continue
		}
		k := key{ev.Package, ev.Test}
		if _, seen := status[k]; !seen {
			if len(order) >= MaxCases {
				return nil, fmt.Errorf("go test -json report: more than %d tests: %w", MaxCases, ErrMalformed)
			}
			order = append(order, k)
			status[k] = Unfinished
		}
		switch ev.Action {
		case "pass":
			status[k] = Passed
		case "fail":
			status[k] = Failed
		case "skip":
			status[k] = Skipped
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("go test -json report: %v: %w", err, ErrMalformed)
	}
	if events == 0 {
		return nil, fmt.Errorf("go test -json report: no events: %w", ErrMalformed)
	}
	var open []string
	for p, ended := range pkgs {
		if !ended {
			open = append(open, p)
		}
	}
	sort.Strings(open)
	if len(open) > 0 {
		r.Complete = false
		r.Problem = "package(s) without a final pass or fail (the test binary exited early): " + strings.Join(open, ", ")
	}
	for _, k := range order {
		name := k.pkg + "." + k.test
		r.Cases = append(r.Cases, Case{Name: name, Aliases: []string{k.test, k.pkg + " " + k.test}, Status: status[k]})
	}
	return r, nil
}

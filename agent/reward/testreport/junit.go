package testreport

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

type junitCase struct {
	Name      string    `xml:"name,attr"`
	Classname string    `xml:"classname,attr"`
	File      string    `xml:"file,attr"`
	Failure   *struct{} `xml:"failure"`
	Error     *struct{} `xml:"error"`
	Skipped   *struct{} `xml:"skipped"`
}

// parseJUnit reads every <testcase> of a JUnit XML document, at any depth
// (testsuites > testsuite > testcase, or nested suites).
func parseJUnit(format string, data []byte) (*Report, error) {
	r := &Report{Format: format, Complete: true}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	sawRoot := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s report: %v: %w", format, err, ErrMalformed)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if !sawRoot {
			sawRoot = true
			if se.Name.Local != "testsuites" && se.Name.Local != "testsuite" {
				return nil, fmt.Errorf("%s report: root element <%s>, want <testsuites> or <testsuite>: %w", format, se.Name.Local, ErrMalformed)
			}
		}
		if se.Name.Local != "testcase" {
			continue
		}
		var jc junitCase
		if err := dec.DecodeElement(&jc, &se); err != nil {
			return nil, fmt.Errorf("%s report: testcase: %v: %w", format, err, ErrMalformed)
		}
		if len(r.Cases) >= MaxCases {
			return nil, fmt.Errorf("%s report: more than %d test cases: %w", format, MaxCases, ErrMalformed)
		}
		st := Passed
		switch {
		case jc.Failure != nil || jc.Error != nil:
			st = Failed
		case jc.Skipped != nil:
			st = Skipped
		}
		name, aliases := junitNames(jc)
		r.Cases = append(r.Cases, Case{Name: name, Aliases: aliases, Status: st})
	}
	if !sawRoot {
		return nil, fmt.Errorf("%s report: no XML element: %w", format, ErrMalformed)
	}
	return r, nil
}

// junitNames derives a case's names. pytest's xunit1 family records the
// file, from which the node id follows: classname "tests.test_calc.TestAdd"
// of file "tests/test_calc.py" is node "tests/test_calc.py::TestAdd::name".
func junitNames(jc junitCase) (string, []string) {
	var aliases []string
	add := func(s string) {
		for _, a := range aliases {
			if a == s {
				return
			}
		}
		aliases = append(aliases, s)
	}
	qualified := jc.Name
	if jc.Classname != "" {
		qualified = jc.Classname + "::" + jc.Name
		add(jc.Classname + "." + jc.Name)
	}
	name := qualified
	if jc.File != "" && strings.HasSuffix(jc.File, ".py") {
		mod := strings.ReplaceAll(strings.TrimSuffix(jc.File, ".py"), "/", ".")
		if rest, ok := strings.CutPrefix(jc.Classname, mod); ok && (rest == "" || rest[0] == '.') {
			node := jc.File
			for _, c := range strings.Split(strings.TrimPrefix(rest, "."), ".") {
				if c != "" {
					node += "::" + c
				}
			}
			name = node + "::" + jc.Name
			add(qualified)
		}
	}
	add(jc.Name)
	return name, aliases
}

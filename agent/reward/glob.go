package reward

import (
	"path"
	"strings"
)

// A glob of a tests reward (protect, deny, editable) is matched against a
// path relative to the workdir, component by component: each component is
// a path.Match pattern, and "**" matches any number of components (none
// included). A glob starting with "/" is matched against the absolute
// path instead. Protect and deny globs without a "/" also match any single
// component (a base name), as they always did: "conftest.py" names every
// conftest.py, "tests" every directory called tests.

// validGlob reports whether every component of g is a valid pattern.
func validGlob(g string) bool {
	if strings.TrimSpace(g) == "" {
		return false
	}
	for _, c := range strings.Split(strings.Trim(g, "/"), "/") {
		if c == "**" {
			continue
		}
		if _, err := path.Match(c, "x"); err != nil {
			return false
		}
	}
	return true
}

// splitGlob returns g's components and whether it is absolute.
func splitGlob(g string) ([]string, bool) {
	abs := strings.HasPrefix(g, "/")
	g = strings.Trim(g, "/")
	if g == "" {
		return nil, abs
	}
	return strings.Split(g, "/"), abs
}

// matchComponents matches a glob's components against a path's.
func matchComponents(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchComponents(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// couldMatchBelow reports whether some path strictly below the directory
// whose components are dir could match pat (for pruning a walk).
func couldMatchBelow(pat, dir []string) bool {
	for len(dir) > 0 {
		if len(pat) == 0 {
			return false
		}
		if pat[0] == "**" {
			return true
		}
		if ok, _ := path.Match(pat[0], dir[0]); !ok {
			return false
		}
		pat, dir = pat[1:], dir[1:]
	}
	return len(pat) > 0
}

// matcher matches paths under a workdir against globs.
type matcher struct {
	workdir string
	globs   []string
	// baseNames: a glob without "/" also matches any one component.
	baseNames bool
}

func (m matcher) rel(p string) []string {
	r := strings.TrimPrefix(strings.TrimPrefix(p, m.workdir), "/")
	if r == "" {
		return nil
	}
	return strings.Split(r, "/")
}

// match reports whether the path p itself matches.
func (m matcher) match(p string) bool {
	for _, g := range m.globs {
		pat, abs := splitGlob(g)
		if abs {
			if matchComponents(pat, strings.Split(strings.Trim(p, "/"), "/")) {
				return true
			}
			continue
		}
		rel := m.rel(p)
		if matchComponents(pat, rel) {
			return true
		}
		if m.baseNames && len(pat) == 1 && len(rel) > 0 {
			if ok, _ := path.Match(pat[0], rel[len(rel)-1]); ok {
				return true
			}
		}
	}
	return false
}

// covers reports whether p or one of its directories below the workdir
// matches: everything under a matched directory is matched.
func (m matcher) covers(p string) bool {
	for q := p; len(q) > len(m.workdir); q = path.Dir(q) {
		if m.match(q) {
			return true
		}
	}
	return false
}

// mayMatchBelow reports whether a path below directory dir could match.
func (m matcher) mayMatchBelow(dir string) bool {
	for _, g := range m.globs {
		pat, abs := splitGlob(g)
		if abs {
			if couldMatchBelow(pat, strings.Split(strings.Trim(dir, "/"), "/")) {
				return true
			}
			continue
		}
		if m.baseNames && len(pat) == 1 {
			return true
		}
		if couldMatchBelow(pat, m.rel(dir)) {
			return true
		}
	}
	return false
}

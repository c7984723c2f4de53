package docs_test

import (
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/scripted"
)

// Every scripted-policy example of the docs is read by the scripted
// policy as a line of its file.
func TestEveryScriptedPolicyExampleIsRead(t *testing.T) {
	n := 0
	for _, f := range docFiles(t) {
		for _, b := range blocks(t, f) {
			if len(b.info) < 2 || b.info[0] != "json" || b.info[1] != "scripted" {
				continue
			}
			n++
			line := strings.Join(strings.Fields(b.body), " ")
			if _, err := scripted.Read(strings.NewReader(line + "\n")); err != nil {
				t.Errorf("%s:%d: the scripted policy refuses the example: %v", f, b.line, err)
			}
		}
	}
	if n < 2 {
		t.Errorf("only %d scripted-policy examples in the docs", n)
	}
}

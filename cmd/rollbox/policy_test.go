package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
)

func TestThePolicyStringSelectsTokenModeAndRefusesAServerWithoutATokenizer(t *testing.T) {
	good, err := fakepolicy.Start(fakepolicy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	_, info, err := openPolicy("openai:"+good.URL()+"#model=fake-model&mode=tokens", nil, policyOptions{})
	if err != nil || info.Mode != trajectory.ModeTokens || info.Tokenizer == nil || info.Tokenizer.Fingerprint == "" {
		t.Fatalf("%+v %v", info, err)
	}
	bad, err := fakepolicy.Start(fakepolicy.Config{NoTokenizer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	for spec, want := range map[string]string{
		"openai:" + bad.URL() + "#model=fake-model&mode=tokens":      "no tokenizer endpoint",
		"openai:" + good.URL() + "#model=fake-model&mode=token":      `mode "token"`,
		"openai:" + good.URL() + "#model=fake-model&tokenize_url=x":  "only for mode=tokens",
		"openai:" + good.URL() + "#model=fake-model&mode=tokens&x=1": `unknown option "x"`,
	} {
		if _, _, err := openPolicy(spec, nil, policyOptions{retries: -1}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", spec, err, want)
		}
	}
	// rollbox run refuses it as bad input, before anything starts.
	out := filepath.Join(t.TempDir(), "out")
	code, _, stderr := rollbox(t, "run", "--out", out, "--tasks", "../../examples/coding/tasks.jsonl", "--policy", "openai:"+bad.URL()+"#model=fake-model&mode=tokens")
	if code != exitBadInput || !strings.Contains(stderr, "no tokenizer endpoint") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output written despite bad input")
	}
}

package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/images"
)

func TestTheConfigurationComesFromTheEnvironmentAndReachesTheLibraries(t *testing.T) {
	src, cache, leases := t.TempDir(), t.TempDir(), t.TempDir()
	env := map[string]string{"ROLLBOX_SRC": src, "ROLLBOX_CACHE": cache, "ROLLBOX_LEASE_DIR": leases,
		"ROLLBOX_OWNER": "someone", "OPENAI_API_KEY": "sk-config", "NO_COLOR": "1"}
	cfg := readConfig(func(k string) string { return env[k] })
	if cfg.leaseDir != leases || cfg.dockerOwner() != "someone" || !cfg.noColor {
		t.Errorf("config %+v", cfg)
	}
	// ROLLBOX_SRC and ROLLBOX_CACHE reach the builder: a source directory
	// without our go.mod is refused, naming it.
	b := cfg.builder(nil)
	if b.CacheDir != cache {
		t.Errorf("cache dir %q, want %q", b.CacheDir, cache)
	}
	if _, err := b.Build(context.Background(), guestTarget); !errors.Is(err, images.ErrNoSource) || !strings.Contains(err.Error(), src) {
		t.Errorf("a ROLLBOX_SRC without our go.mod: %v", err)
	}
	// OPENAI_API_KEY reaches an OpenAI-compatible policy.
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices": [{"message": {"content": "ok"}}]}`)
	}))
	defer srv.Close()
	p, _, err := openPolicy("openai:"+srv.URL+"#model=m", nil, policyOptions{apiKey: cfg.openAIKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Next(context.Background(), agent.Request{Messages: []agent.Message{{Role: agent.RoleUser, Content: "hi"}}}); err != nil {
		t.Fatal(err)
	}
	if got != "Bearer sk-config" {
		t.Errorf("Authorization %q", got)
	}
}

func TestServeLeavesTheProcessEnvironmentAlone(t *testing.T) {
	if v, ok := os.LookupEnv("ROLLBOX_OWNER"); ok {
		os.Unsetenv("ROLLBOX_OWNER")
		t.Cleanup(func() { os.Setenv("ROLLBOX_OWNER", v) })
	}
	_, stop := serve(t, "--data", filepath.Join(t.TempDir(), "data"))
	if code := stop(); code != exitOK {
		t.Fatalf("serve exited %d", code)
	}
	if v, ok := os.LookupEnv("ROLLBOX_OWNER"); ok {
		t.Errorf("serve set ROLLBOX_OWNER=%s for the whole process (its owner goes to the backend as an option)", v)
	}
}

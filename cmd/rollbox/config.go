package main

import (
	"io"
	"os"

	"github.com/rollbox/rollbox/images"
	"github.com/rollbox/rollbox/internal/lease"
)

// config is what rollbox takes from its environment. It is read once, when
// a command starts (run), and handed to the libraries as options: none of
// them reads the environment itself.
type config struct {
	// owner is $ROLLBOX_OWNER, the rollbox.owner label of the containers
	// this process makes ("" for the command's default).
	owner string
	// guest is $ROLLBOX_GUEST, a prebuilt guest agent ("" builds one).
	guest string
	// cacheDir is $ROLLBOX_CACHE, where built programs and compiled WASM
	// modules are kept ("" for the user's cache directory).
	cacheDir string
	// sourceDir is $ROLLBOX_SRC, the module root programs are built from
	// ("" finds it above the working directory or the executable).
	sourceDir string
	// leaseDir is $ROLLBOX_LEASE_DIR, else the default for this user
	// ($XDG_RUNTIME_DIR's) (internal/lease).
	leaseDir string
	// auditLog is $ROLLBOX_AUDIT_LOG, the default of --audit-log;
	// auditSyncNone is $ROLLBOX_AUDIT_SYNC=none.
	auditLog      string
	auditSyncNone bool
	// pythonWASM and pythonHome are $ROLLBOX_PYTHON_WASM and
	// $ROLLBOX_PYTHON_HOME, a CPython WASI build for the WASM backend.
	pythonWASM, pythonHome string
	// openAIKey is $OPENAI_API_KEY, sent to OpenAI-compatible policies.
	openAIKey string
	// dockerHost is $DOCKER_HOST: where an engine may answer besides the
	// default socket.
	dockerHost string
	// noColor is $NO_COLOR set or $TERM=dumb.
	noColor bool
}

// readConfig reads the configuration through getenv (os.Getenv).
func readConfig(getenv func(string) string) config {
	c := config{
		owner: getenv("ROLLBOX_OWNER"), guest: getenv("ROLLBOX_GUEST"),
		cacheDir: getenv("ROLLBOX_CACHE"), sourceDir: getenv("ROLLBOX_SRC"), leaseDir: getenv("ROLLBOX_LEASE_DIR"),
		auditLog: getenv("ROLLBOX_AUDIT_LOG"), auditSyncNone: getenv("ROLLBOX_AUDIT_SYNC") == "none",
		pythonWASM: getenv("ROLLBOX_PYTHON_WASM"), pythonHome: getenv("ROLLBOX_PYTHON_HOME"),
		openAIKey: getenv("OPENAI_API_KEY"), dockerHost: getenv("DOCKER_HOST"),
		noColor: getenv("NO_COLOR") != "" || getenv("TERM") == "dumb",
	}
	if c.leaseDir == "" {
		c.leaseDir = lease.DefaultDir(getenv("XDG_RUNTIME_DIR"))
	}
	if c.cacheDir == "" {
		c.cacheDir = images.DefaultCacheDir()
	}
	return c
}

// builder builds this module's programs (guests, the probe) from the
// configured source into the configured cache.
func (c config) builder(progress io.Writer) *images.Builder {
	b := images.NewBuilder(progress)
	b.CacheDir = c.cacheDir
	if c.sourceDir != "" {
		b.SourceDir = c.sourceDir
	}
	return b
}

// dockerEngineMayAnswer reports whether a docker engine may be reachable:
// $DOCKER_HOST is set or the default socket exists.
func (c config) dockerEngineMayAnswer() bool {
	if c.dockerHost != "" {
		return true
	}
	_, err := os.Stat("/var/run/docker.sock")
	return err == nil
}

// Command wasmhelper is the WASM backend's helper process: it runs episode
// commands (the shell, WASI modules) confined, on behalf of a Rollbox
// service that starts it. See sandbox/wasm/RATIONALE.md.
package main

import (
	"os"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/helper"
)

func main() { os.Exit(helper.Main()) }

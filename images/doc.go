// Package images builds what Rollbox runs inside sandboxes from the source in
// this directory: the static guest agent that is PID 1 of every container
// (images/guest), the WASI guest programs (images/wasm/...), and it names the
// container image recipes (images/recipes/...). Builds are content-addressed
// and cached on disk, so a second build of unchanged source is a no-op.
//
// Nothing here imports a container or WASM client: backends take the paths
// this package produces.
package images

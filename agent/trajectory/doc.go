// Package trajectory holds the record of one episode (schema
// rollbox.trajectory/v1): identity, the sandbox as it really ran, the policy,
// every model turn and tool result in order, context events, how the
// episode ended and its reward. A Writer records it step by step so a crash
// loses at most the step in flight; Recover turns what a crashed writer left
// into a trajectory that ends "interrupted".
package trajectory

package runtime

// HoldRecovery makes the Server opened with o wait for gate to close before
// it recovers what a previous process left (tests of the "recovering" state).
func HoldRecovery(o *Options, gate chan struct{}) { o.recoveryGate = gate }

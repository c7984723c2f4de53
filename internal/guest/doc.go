// Package guest is the guest agent's logic: the program that runs as PID 1
// of every container sandbox (images/guest is its tiny main). It serves the
// guestproto protocol on its stdin/stdout, runs each command in its own
// session and process group, enforces timeouts, idle timeouts and output caps
// inside the sandbox, kills whatever a command leaves behind, reaps every
// zombie, detects OOM kills, and moves files without following symlinks out
// of the directories the host names.
//
// It is a library so it can be tested in-process on the host: Serve works
// the same when it is not PID 1 (it then makes itself a child subreaper).
//
// # Processes
//
// One goroutine (the reaper) waits for any child (wait4(-1)) and hands each
// exit status to the command waiting for that pid, so reaping orphans never
// steals a command's status. When no command is live, nothing but PID 1 may
// exist: the guest kills every other process with kill(-1, SIGKILL) until
// none is left (see procs). Spawning and sweeping share one lock with the
// reaper's dispatch, which closes the race between a fork and the
// registration of its pid.
package guest

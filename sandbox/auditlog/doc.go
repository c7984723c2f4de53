// Package auditlog keeps an append-only record of what every sandbox was
// asked to do: one JSON line per sandbox created, command run, file written
// and sandbox closed, each carrying the hash of the line before it, so that
// editing, inserting or deleting a line is detectable (Verify names the
// first bad line). Wrap puts the log around any sandbox.Backend.
//
// A record keeps the command itself when it is small (InlineBytes) and its
// SHA-256 otherwise; stdin and file contents are kept only as their SHA-256
// and size. Each line is written with one write(2) under an flock, so
// several processes may share a log; concurrent appends are committed in
// groups, one fsync for each group (Log.Append); fsync policy: see Sync.
package auditlog

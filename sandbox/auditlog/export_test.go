package auditlog

// Syncs is how many times l fsynced appended lines.
func Syncs(l *Log) uint64 { return l.syncs.Load() }

package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClaimLogKeepsClaimsAcrossARestart: the coordinator's claims survive
// a restart (the log read back), a dropped claim stays dropped, a last
// line torn after its episode id marks that claim asked (no silent re-run),
// claim files of the earlier layout are carried over, and the log is
// rewritten with the live claims only.
func TestClaimLogKeepsClaimsAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "claims"), 0o755)
	os.WriteFile(filepath.Join(dir, "claims", "old.json"), []byte(`{"attempt":2,"worker":"w0"}`), 0o644)
	l, err := openClaimLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cl, ok := l.get("old"); !ok || cl.Attempt != 2 || cl.Worker != "w0" {
		t.Errorf("the earlier layout's claim: %+v %v", cl, ok)
	}
	if _, err := os.Stat(filepath.Join(dir, "claims")); !os.IsNotExist(err) {
		t.Errorf("the earlier layout's directory is left: %v", err)
	}
	for i := range 100 {
		l.save("gone", claimRecord{Attempt: i + 1, Worker: "w1"})
	}
	l.drop("gone")
	l.save("a", claimRecord{Attempt: 1, Worker: "w1", AckSubject: "$JS.ACK.x"})
	l.save("a", claimRecord{Attempt: 1, Worker: "w1", AckSubject: "$JS.ACK.x", Asked: true})
	l.save("b", claimRecord{Attempt: 3, Worker: "w2"})
	l.close()
	// The machine stopped while b's asked line was being written.
	f, _ := os.OpenFile(filepath.Join(dir, "claims.log"), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`b` + "\t" + `{"attempt":3,"wor`)
	f.Close()

	l, err = openClaimLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if _, ok := l.get("gone"); ok {
		t.Error("a dropped claim is back")
	}
	if cl, ok := l.get("a"); !ok || cl != (claimRecord{Attempt: 1, Worker: "w1", AckSubject: "$JS.ACK.x", Asked: true}) {
		t.Errorf("claim a: %+v %v", cl, ok)
	}
	if cl, ok := l.get("b"); !ok || cl.Attempt != 3 || cl.Worker != "w2" || !cl.Asked {
		t.Errorf("claim b after a torn line: %+v %v, want attempt 3 of w2, asked", cl, ok)
	}
	if l.lines != 3 {
		t.Errorf("the log has %d lines after the restart, want the 3 live claims", l.lines)
	}
	for i := range 20000 {
		l.save("c", claimRecord{Attempt: i})
	}
	if l.lines > 10001 {
		t.Errorf("the log grew to %d lines for 4 live claims", l.lines)
	}
}

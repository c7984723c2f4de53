package guesthost

import (
	"strings"
	"testing"
)

func TestTheGuestLogKeepsACrashsCauseAndItsEnd(t *testing.T) {
	tests := []struct {
		name    string
		written []string
		want    []string
		leftOut bool
	}{
		{"a short log is kept whole", []string{"guest: reply exec-result to 3: broken pipe\n"},
			[]string{"guest: reply exec-result to 3: broken pipe\n"}, false},
		{"a goroutine dump far over the cap keeps its first lines and its last",
			[]string{"runtime: failed to create new OS thread (have 10 already; errno=11)\nfatal error: newosproc\n",
				strings.Repeat("goroutine 7 [chan receive]:\n\tmain.main()\n", 4000), "goroutine 99 [select]:\nthe end\n"},
			[]string{"fatal error: newosproc", "the end", "bytes of the guest's log left out"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLog(1 << 10)
			for _, w := range tt.written {
				l.Write([]byte(w))
			}
			got := l.String()
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("log lacks %q:\n%s", w, got)
				}
			}
			if strings.Contains(got, "left out") != tt.leftOut {
				t.Errorf("left-out marker = %v, want %v", !tt.leftOut, tt.leftOut)
			}
			if len(got) > 1<<10+100 {
				t.Errorf("kept %d bytes, over the 1 KiB cap", len(got))
			}
		})
	}
}

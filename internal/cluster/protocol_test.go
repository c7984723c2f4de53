package cluster

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestAnEpisodeIDBecomesOneSubjectTokenWhateverItHolds(t *testing.T) {
	for _, id := range []string{"r-1.fix-add.0", "r-1.a b*c>d.3", "r-1.ünï.12", "r-1..\t.0"} {
		tok := Token(id)
		if strings.ContainsAny(tok, ". *>\t") || tok == "" {
			t.Errorf("Token(%q) = %q is not one subject token", id, tok)
		}
		back, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || string(back) != id {
			t.Errorf("Token(%q) = %q does not decode back (%q, %v)", id, tok, back, err)
		}
		if s := WorkSubject("wasm", id); !strings.HasPrefix(s, "rollbox.work.wasm.") || strings.Count(s, ".") != 3 {
			t.Errorf("WorkSubject(wasm, %q) = %q", id, s)
		}
	}
}

func TestCheckURLWantsANatsURL(t *testing.T) {
	for _, ok := range []string{"nats://127.0.0.1:4222", "tls://nats.example:4222"} {
		if err := CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:4222", "http://x:4222", "nats://"} {
		if err := CheckURL(bad); err == nil {
			t.Errorf("CheckURL(%q) took it", bad)
		}
	}
}

package sandbox

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestCaptureKeepsHeadAndTail(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		writes []string
	}{
		{"output under the cap is kept whole", 10, []string{"hello"}},
		{"output exactly at the cap is kept whole", 4, []string{"ab", "cd"}},
		{"one large write keeps its ends", 4, []string{"abcdefgh"}},
		{"many small writes keep the ends", 5, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}},
		{"a zero cap keeps nothing", 0, []string{"abc"}},
		{"an odd cap gives the head the extra byte", 3, []string{"0123456789"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCapture(tt.limit)
			var all []byte
			for _, w := range tt.writes {
				c.Write([]byte(w))
				all = append(all, w...)
			}
			want := all
			var dropped int64
			if len(all) > tt.limit {
				h := tt.limit - tt.limit/2
				want = append(append([]byte{}, all[:h]...), all[len(all)-tt.limit/2:]...)
				dropped = int64(len(all) - tt.limit)
			}
			if got := c.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("Bytes() = %q, want %q", got, want)
			}
			if c.Dropped() != dropped {
				t.Errorf("Dropped() = %d, want %d", c.Dropped(), dropped)
			}
			if c.Total() != int64(len(all)) {
				t.Errorf("Total() = %d, want %d", c.Total(), len(all))
			}
		})
	}
}

func TestCaptureMatchesModelOnRandomWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		limit := r.IntN(64)
		c := NewCapture(limit)
		var all []byte
		for range r.IntN(20) {
			w := make([]byte, r.IntN(40))
			for j := range w {
				w[j] = byte('a' + r.IntN(26))
			}
			c.Write(w)
			all = append(all, w...)
		}
		want := all
		if len(all) > limit {
			want = append(append([]byte{}, all[:limit-limit/2]...), all[len(all)-limit/2:]...)
		}
		if got := c.Bytes(); !bytes.Equal(got, want) {
			t.Fatalf("case %d limit %d: Bytes() = %q, want %q", i, limit, got, want)
		}
		if got, want := c.Dropped()+int64(len(c.Bytes())), int64(len(all)); got != want {
			t.Fatalf("case %d: kept+dropped = %d, want %d", i, got, want)
		}
	}
}

func ExampleCapture() {
	c := NewCapture(8)
	fmt.Fprint(c, "0123456789abcdef")
	fmt.Printf("%s dropped=%d\n", c.Bytes(), c.Dropped())
	// Output: 0123cdef dropped=8
}

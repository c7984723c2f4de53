package guesthost

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

type runningEngine struct{}

func (runningEngine) Diagnose(context.Context) Diagnosis {
	return Diagnosis{State: "container running"}
}

// pingOnlyGuest speaks the protocol on r and w: it answers Hello and every
// ping, sealed, and takes every other request without answering it, as a
// guest does whose command requests a command of the sandbox reads off its
// stdin before it (gVisor lets a command open /proc/1/fd/0) while the pings
// get through.
func pingOnlyGuest(r io.Reader, w io.Writer) {
	rd, wr := guestproto.NewReader(r), guestproto.NewWriter(w)
	var key []byte
	for {
		m, err := rd.ReadMessage()
		if err != nil {
			return
		}
		switch m.Type {
		case guestproto.TypeHello:
			body, err := guestproto.DecodeMessage(m)
			if err != nil {
				return
			}
			key = body.(*guestproto.Hello).Key
			p := (&guestproto.HelloReply{Version: int(guestproto.Version), Agent: "ping-only", Sealed: true}).Encode(nil)
			wr.WriteMessage(guestproto.TypeHelloReply, m.ID, guestproto.Seal(key, guestproto.TypeHelloReply, m.ID, p))
		case guestproto.TypePing:
			wr.WriteMessage(guestproto.TypePong, m.ID, guestproto.Seal(key, guestproto.TypePong, m.ID, nil))
		}
	}
}

// A command whose answer never comes while the guest answers every ping is
// the commands' doing (ErrSandboxAbuse), not infrastructure: it was judged
// infrastructure ("no answer after the command's timeout", an unscored
// episode) before.
func TestACommandNeverAnsweredWhileThePingsAreIsNotInfra(t *testing.T) {
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	go pingOnlyGuest(guestR, guestW)
	c := New(Config{
		ID: "0123456789ab", Spec: sandbox.Spec{Image: "base"}.WithDefaults(), GuestTimeout: 5 * time.Second,
		Engine: runningEngine{}, AnswerGrace: 300 * time.Millisecond,
		Cut: func(error) { hostR.Close(); hostW.Close() },
	})
	c.Attach(hostR, hostW)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.Exec(ctx, sandbox.ExecRequest{Shell: "true", Timeout: 200 * time.Millisecond})
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || sandbox.IsInfra(err) || !sandbox.IsAbuse(err) {
		t.Errorf("want the commands' doing (IsAbuse, not IsInfra), got %v", err)
	}
	guestR.Close()
	guestW.Close()
}

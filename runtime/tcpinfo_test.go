package runtime

import (
	"net"
	"testing"
	"time"
)

// A request that waited in its socket before the service read it (the
// accept loop and the connection's goroutine behind thousands of runnable
// ones) counts in /healthz's Server-Timing: the kernel says how long ago
// its bytes arrived.
func TestTheWaitOfARequestInItsSocketIsMeasured(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if _, err := client.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // not read
	if d := sinceDataArrived(server); d < 250*time.Millisecond || d > 5*time.Second {
		t.Errorf("a request unread for 300 ms: its bytes arrived %v ago, says TCP_INFO", d)
	}
}

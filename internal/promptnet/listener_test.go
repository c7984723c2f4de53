package promptnet

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func tcpListener(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln.(*net.TCPListener)
}

// echoLine accepts one connection from l and answers its first line with
// "echo: " and the line.
func echoLine(l *Listener) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			_, err = io.WriteString(c, "echo: "+line)
		}
		done <- err
	}()
	return done
}

// ask sends line on a new connection to addr after waiting delay, and
// returns the answer.
func ask(t *testing.T, addr net.Addr, delay time.Duration, line string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(delay)
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", line, err)
	}
	return got
}

func TestListener(t *testing.T) {
	for _, tc := range []struct {
		name     string
		busy     bool
		ordinary bool
		delay    time.Duration
	}{
		{"an idle listener accepts through the ordinary Accept", false, true, 0},
		{"a busy listener accepts through both", true, true, 0},
		{"a busy listener's timer loop alone accepts a connection whose request is there", true, false, 0},
		{"a busy listener's timer loop holds a connection until its request arrives", true, false, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var busy atomic.Bool
			busy.Store(tc.busy)
			l, err := listen(tcpListener(t), time.Millisecond, busy.Load, nil, tc.ordinary)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for i, line := range []string{"one\n", "two\n"} {
				done := echoLine(l)
				if got := ask(t, l.Addr(), tc.delay, line); got != "echo: "+line {
					t.Errorf("connection %d answered %q, want %q", i, got, "echo: "+line)
				}
				if err := <-done; err != nil {
					t.Errorf("connection %d: the server side: %v", i, err)
				}
			}
		})
	}
}

func TestListenerHandsOverASilentConnectionAfterHoldAtMost(t *testing.T) {
	l, err := listen(tcpListener(t), time.Millisecond, func() bool { return true }, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		sc, err := l.Accept()
		if err == nil {
			accepted <- sc
		}
	}()
	select {
	case sc := <-accepted:
		sc.Close()
	case <-time.After(holdAtMost + 5*time.Second):
		t.Fatalf("a connection that sent nothing was not handed over %s after %s", 5*time.Second, holdAtMost)
	}
}

func TestListenerClose(t *testing.T) {
	l, err := listen(tcpListener(t), time.Millisecond, func() bool { return true }, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	// A connection held for its request when the listener closes is closed.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(20 * time.Millisecond)
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("a connection held when the listener closed read %d bytes, want it closed", n)
	} else if isTimeout(err) {
		t.Errorf("a connection held when the listener closed stayed open: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A busy listener's own goroutine answers the requests Answer takes, with
// nobody calling Accept (the HTTP server's goroutines not scheduled),
// whichever of its loops accepted the connection: the peer reads the whole
// answer, then the end of the connection. A request Answer declines is
// handed over to Accept whole, unread.
func TestABusyListenerAnswersAProbeItselfAndHandsTheRestOver(t *testing.T) {
	for _, ordinary := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordinary accept %v", ordinary), func(t *testing.T) { testAnswering(t, ordinary) })
	}
}

func testAnswering(t *testing.T, ordinary bool) {
	var offered atomic.Int64
	answer := func(p Probe) ([]byte, bool) {
		offered.Add(1)
		if !strings.HasPrefix(string(p.Request), "GET /probe ") || !strings.HasSuffix(string(p.Request), "\r\n\r\n") {
			return nil, false
		}
		if time.Since(p.Accepted) > time.Minute || p.DataAge < 0 {
			t.Errorf("probe accepted %v ago, data %v old", time.Since(p.Accepted), p.DataAge)
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"), true
	}
	l, err := listen(tcpListener(t), time.Millisecond, func() bool { return true }, answer, ordinary)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 3 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /probe HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c) // the answer, then EOF
		c.Close()
		if err != nil || !strings.HasSuffix(string(got), "\r\n\r\nok\n") {
			t.Fatalf("probe %d: answered %q, %v; want the listener's own answer and the connection closed", i, got, err)
		}
	}
	done := echoLine(l)
	if got := ask(t, l.Addr(), 0, "GET /other HTTP/1.1\r\n\r\n"); got != "echo: GET /other HTTP/1.1\r\n" {
		t.Errorf("a request Answer declined reached Accept as %q", got)
	}
	if err := <-done; err != nil {
		t.Error(err)
	}
	if n := offered.Load(); n != 4 {
		t.Errorf("Answer was offered %d requests, want 4", n)
	}
}

// Detach, with connections taken and not yet handed over (one by the
// ordinary accept, the rest held by the busy loop before their requests
// came): each is handed to Accept, which then says the listener is closed;
// a connection made after it waits in the socket's backlog for a copy of
// the socket (a process taking over) to accept it.
func TestADetachedListenerHandsOverWhatItTookAndLeavesTheRestToACopy(t *testing.T) {
	ln := tcpListener(t)
	copied, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer copied.Close()
	var busy atomic.Bool
	busy.Store(true)
	l, err := Listen(ln, 2*time.Millisecond, busy.Load, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	time.Sleep(100 * time.Millisecond) // taken by the two loops, none asked for yet
	if err := l.Detach(); err != nil {
		t.Fatal(err)
	}
	late, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	var served []net.Conn
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("Accept after Detach: %v", err)
		}
		defer c.Close()
		served = append(served, c)
	}
	if len(served) != len(clients) {
		t.Fatalf("Accept handed over %d of the %d connections taken before Detach", len(served), len(clients))
	}
	for i, c := range clients {
		fmt.Fprintf(c, "hello %d\n", i)
	}
	for _, c := range served {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "hello ") {
			t.Errorf("a handed-over connection: %q %v", line, err)
		}
	}
	taker, err := net.FileListener(copied)
	if err != nil {
		t.Fatal(err)
	}
	defer taker.Close()
	c, err := taker.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(late, "late")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "late\n" {
		t.Errorf("the connection made after Detach, through the copy: %q %v", line, err)
	}
}

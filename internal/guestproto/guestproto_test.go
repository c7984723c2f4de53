package guestproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMessagesRoundTrip(t *testing.T) {
	when := time.Unix(1700000000, 123)
	tests := []struct {
		name string
		t    Type
		in   Payload
	}{
		{"a hello names roots and limits", TypeHello, &Hello{Version: 1, WritableRoots: []string{"/work", "/tmp"}, MemoryGuardBytes: 64 << 20, ProcessLimit: 96}},
		{"a hello reply names the agent", TypeHelloReply, &HelloReply{Version: 1, Agent: "x", PID: 1, OOMSource: "cgroup1"}},
		{"an exec carries argv, env and binary stdin", TypeExec, &Exec{Argv: []string{"echo", "a b", ""}, Env: []string{"A=1"}, Workdir: "/work",
			Timeout: time.Second, IdleTimeout: time.Millisecond, OutputCap: 10, Stdin: []byte{0, 0xff, 'x'}}},
		{"an exec may be a shell line", TypeExec, &Exec{Shell: "echo hi | cat", Env: []string{}}},
		{"an exec result keeps every field", TypeExecResult, &ExecResult{ExitCode: 143, Signal: "SIGTERM", Stdout: []byte("out"), Stderr: []byte{},
			StdoutDropped: 5, StderrDropped: 1 << 40, TimedOut: true, IdleTimedOut: true, OOMKilled: true, Duration: time.Hour}},
		{"a negative exit code survives", TypeExecResult, &ExecResult{ExitCode: -1, Stdout: []byte{}, Stderr: []byte{}}},
		{"read file", TypeReadFile, &ReadFile{Path: "/work/x", MaxBytes: 100}},
		{"file data may be binary", TypeFileData, &FileData{Data: []byte{0xc3, 0x28}}},
		{"write file", TypeWriteFile, &WriteFile{Path: "/work/a/b", Mode: 0o755, Data: []byte("x")}},
		{"list dir", TypeListDir, &ListDir{Path: "/work"}},
		{"dir list", TypeDirList, &DirList{Entries: []DirEntry{{Name: "a", Size: 3, Mode: 0o644, ModTime: when}, {Name: "l", Link: "/etc", IsDir: false, ModTime: when}}}},
		{"error", TypeError, &Error{Code: CodeNotFound, Message: "nope"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if err := w.WriteMessage(tt.t, 7, tt.in.Encode(nil)); err != nil {
				t.Fatal(err)
			}
			m, err := NewReader(&buf).ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			if m.Type != tt.t || m.ID != 7 {
				t.Fatalf("got %s id %d", m.Type, m.ID)
			}
			out, err := DecodeMessage(m)
			if err != nil {
				t.Fatal(err)
			}
			normalize(tt.in)
			normalize(out)
			if !reflect.DeepEqual(out, tt.in) {
				t.Errorf("round trip:\n got %#v\nwant %#v", out, tt.in)
			}
		})
	}
}

// normalize makes nil and empty slices compare equal.
func normalize(p Payload) {
	switch m := p.(type) {
	case *Exec:
		if len(m.Env) == 0 {
			m.Env = nil
		}
		if len(m.Stdin) == 0 {
			m.Stdin = nil
		}
	case *ExecResult:
		if len(m.Stdout) == 0 {
			m.Stdout = nil
		}
		if len(m.Stderr) == 0 {
			m.Stderr = nil
		}
	case *DirList:
		for i := range m.Entries {
			m.Entries[i].ModTime = m.Entries[i].ModTime.UTC()
		}
	}
}

func TestLargeMessagesAreSplitAndReassembled(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 350_000) // 3.5 MB: 4 frames
	var buf bytes.Buffer
	w := NewWriter(&buf)
	// Interleave a small message of another id between the frames' writer calls.
	if err := w.WriteMessage(TypeFileData, 1, (&FileData{Data: big}).Encode(nil)); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMessage(TypePing, 2, nil); err != nil {
		t.Fatal(err)
	}
	frames := 0
	for b := buf.Bytes(); len(b) > 0; frames++ {
		_, n, err := DecodeFrame(b)
		if err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if frames != 5 {
		t.Errorf("%d frames, want 4 for the file and 1 for the ping", frames)
	}
	r := NewReader(&buf)
	m, err := r.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	var fd FileData
	if err := Expect(m, TypeFileData, &fd); err != nil || !bytes.Equal(fd.Data, big) {
		t.Fatalf("reassembled %d bytes, err %v", len(fd.Data), err)
	}
	if m, err := r.ReadMessage(); err != nil || m.Type != TypePing || m.ID != 2 {
		t.Fatalf("second message %v %v", m, err)
	}
	if _, err := r.ReadMessage(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v, want EOF", err)
	}
}

func TestBadFramesAreRefused(t *testing.T) {
	good := AppendHeader(nil, TypePing, 0, 1, 0)
	tests := []struct {
		name  string
		frame []byte
		want  string
	}{
		{"a wrong magic", append([]byte{0x00}, good[1:]...), "magic"},
		{"another version", append([]byte{Magic, 9}, good[2:]...), "version"},
		{"an unknown type", append([]byte{Magic, Version, 200}, good[3:]...), "unknown type"},
		{"unknown flags", append([]byte{Magic, Version, byte(TypePing), 0x80}, good[4:]...), "flags"},
		{"a length above the cap", AppendHeader(nil, TypeExec, 0, 1, MaxFrame+1), "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.frame))
			if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrBadFrame mentioning %q", err, tt.want)
			}
		})
	}
	t.Run("a frame cut short is an unexpected EOF", func(t *testing.T) {
		f := AppendHeader(nil, TypeFileData, 0, 1, 100)
		if _, err := ReadFrame(bytes.NewReader(append(f, 1, 2, 3))); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("a huge announced payload that never comes allocates little", func(t *testing.T) {
		f := AppendHeader(nil, TypeFileData, 0, 1, MaxFrame)
		allocs := testing.AllocsPerRun(5, func() { ReadFrame(bytes.NewReader(f)) })
		if allocs > 10 {
			t.Errorf("%v allocations", allocs)
		}
	})
	t.Run("a message continued with another type is refused", func(t *testing.T) {
		var b []byte
		b = AppendHeader(b, TypeFileData, FlagMore, 1, 1)
		b = append(b, 0)
		b = AppendHeader(b, TypeOK, 0, 1, 0)
		if _, err := NewReader(bytes.NewReader(b)).ReadMessage(); !errors.Is(err, ErrBadFrame) {
			t.Errorf("err = %v", err)
		}
	})
}

func TestPayloadDecodersCheckLengths(t *testing.T) {
	// A list claiming 2^60 strings in 3 bytes must fail without allocating.
	p := []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10}
	var e Exec
	if err := e.Decode(p); !errors.Is(err, ErrBadFrame) {
		t.Errorf("err = %v", err)
	}
	var r ExecResult
	if err := r.Decode([]byte{0}); !errors.Is(err, ErrBadFrame) {
		t.Errorf("truncated result: err = %v", err)
	}
	ok := (&ReadFile{Path: "/x"}).Encode(nil)
	var rf ReadFile
	if err := rf.Decode(append(ok, 0)); !errors.Is(err, ErrBadFrame) {
		t.Errorf("trailing bytes: err = %v", err)
	}
}

// TestClientMultiplexes runs a fake guest that answers requests out of
// order; each caller must get its own reply.
func TestClientMultiplexes(t *testing.T) {
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	go func() {
		r, w := NewReader(guestR), NewWriter(guestW)
		var held []Message
		for {
			m, err := r.ReadMessage()
			if err != nil {
				guestW.Close()
				return
			}
			if m.Type == TypeCancel {
				continue
			}
			held = append(held, m)
			if len(held) == 10 { // answer in reverse order
				for i := len(held) - 1; i >= 0; i-- {
					var rf ReadFile
					rf.Decode(held[i].Payload)
					w.WriteMessage(TypeFileData, held[i].ID, (&FileData{Data: []byte(rf.Path)}).Encode(nil))
				}
				held = nil
			}
		}
	}()
	c := NewClient(hostR, hostW)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/p" + strings.Repeat("x", i)
			m, err := c.Call(context.Background(), TypeReadFile, &ReadFile{Path: path})
			if err != nil {
				t.Error(err)
				return
			}
			var fd FileData
			if err := Expect(m, TypeFileData, &fd); err != nil || string(fd.Data) != path {
				t.Errorf("call %d got %q %v", i, fd.Data, err)
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Call(ctx, TypePing, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	hostW.Close()
	<-c.Done()
	if _, err := c.Call(context.Background(), TypePing, nil); !errors.Is(err, ErrClientClosed) {
		t.Errorf("call after the end: %v", err)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	seed := func(t Type, flags byte, id uint32, p Payload) []byte {
		var body []byte
		if p != nil {
			body = p.Encode(nil)
		}
		return append(AppendHeader(nil, t, flags, id, len(body)), body...)
	}
	f.Add(seed(TypePing, 0, 1, nil))
	f.Add(seed(TypeHello, 0, 1, &Hello{Version: 1, WritableRoots: []string{"/work", "/tmp"}}))
	f.Add(seed(TypeExec, 0, 2, &Exec{Argv: []string{"sh", "-c", "echo"}, Env: []string{"A=B"}, Stdin: []byte("in")}))
	f.Add(seed(TypeExecResult, 0, 2, &ExecResult{ExitCode: 1, Stdout: []byte("x"), Signal: "SIGKILL"}))
	f.Add(seed(TypeDirList, 0, 3, &DirList{Entries: []DirEntry{{Name: "a"}}}))
	f.Add(seed(TypeError, 0, 4, &Error{Code: "x", Message: "y"}))
	f.Add(append(seed(TypeFileData, FlagMore, 5, &FileData{Data: []byte("ab")}), seed(TypeFileData, 0, 5, nil)...))
	f.Add(AppendHeader(nil, TypeWriteFile, 0, 1, MaxFrame))
	f.Add([]byte{Magic, Version, 5, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		// The slice decoder and the stream reader must agree and never panic.
		fr, n, err := DecodeFrame(data)
		if err == nil {
			if n > len(data) || len(fr.Payload) > MaxFrame {
				t.Fatalf("frame of %d bytes from %d", n, len(data))
			}
			if p := New(fr.Type); p != nil {
				p.Decode(fr.Payload)
			}
		}
		sf, serr := ReadFrame(bytes.NewReader(data))
		if (err == nil) != (serr == nil) {
			t.Fatalf("DecodeFrame err %v, ReadFrame err %v", err, serr)
		}
		if err == nil && (!bytes.Equal(sf.Payload, fr.Payload) || sf.ID != fr.ID || sf.Type != fr.Type) {
			t.Fatalf("decoders disagree")
		}
		// A whole stream of these reassembles without panicking or
		// holding more than it was given.
		r := NewReader(bytes.NewReader(data))
		for {
			m, err := r.ReadMessage()
			if err != nil {
				break
			}
			if len(m.Payload) > len(data) {
				t.Fatalf("message of %d bytes from %d", len(m.Payload), len(data))
			}
			DecodeMessage(m)
		}
	})
}

func TestSealedRepliesOpenOnlyWithTheirKeyTypeAndID(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	body := []byte("exit 0")
	sealed := Seal(key, TypeExecResult, 9, append([]byte(nil), body...))
	m, ok := Open(key, Message{Type: TypeExecResult, ID: 9, Payload: sealed})
	if !ok || !bytes.Equal(m.Payload, body) {
		t.Fatalf("Open = %q, %v", m.Payload, ok)
	}
	for _, tt := range []struct {
		name string
		m    Message
		key  []byte
	}{
		{"another key", Message{Type: TypeExecResult, ID: 9, Payload: sealed}, bytes.Repeat([]byte{8}, KeySize)},
		{"another id", Message{Type: TypeExecResult, ID: 10, Payload: sealed}, key},
		{"another type", Message{Type: TypeFileData, ID: 9, Payload: sealed}, key},
		{"no seal", Message{Type: TypeExecResult, ID: 9, Payload: body}, key},
		{"a changed body", Message{Type: TypeExecResult, ID: 9, Payload: append([]byte("exit 1"), sealed[len(body):]...)}, key},
	} {
		if _, ok := Open(tt.key, tt.m); ok {
			t.Errorf("%s: opened", tt.name)
		}
	}
}

func TestHelloCarriesAnOptionalKey(t *testing.T) {
	for _, h := range []Hello{{Version: 1, WritableRoots: []string{"/work"}}, {Version: 1, Key: bytes.Repeat([]byte{1}, KeySize)}} {
		var got Hello
		if err := got.Decode(h.Encode(nil)); err != nil || !bytes.Equal(got.Key, h.Key) {
			t.Errorf("round trip of %+v: %+v %v", h, got, err)
		}
	}
	for _, r := range []HelloReply{{Version: 1, Agent: "a"}, {Version: 1, Agent: "a", Sealed: true}} {
		var got HelloReply
		if err := got.Decode(r.Encode(nil)); err != nil || got.Sealed != r.Sealed {
			t.Errorf("round trip of %+v: %+v %v", r, got, err)
		}
	}
}

func TestAnAuthenticatingClientDropsForgedReplies(t *testing.T) {
	key := bytes.Repeat([]byte{3}, KeySize)
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	c := NewClient(hostR, hostW)
	c.Authenticate(key)
	go func() { // the guest, and a forger writing into its stream first
		rd := NewReader(guestR)
		m, err := rd.ReadMessage()
		if err != nil {
			return
		}
		w := NewWriter(guestW)
		w.WriteMessage(TypePong, m.ID, []byte("forged"))
		w.WriteMessage(TypePong, m.ID, Seal(key, TypePong, m.ID, nil))
	}()
	m, err := c.Call(context.Background(), TypePing, nil)
	if err != nil || m.Type != TypePong || len(m.Payload) != 0 {
		t.Fatalf("Call = %+v, %v; want the sealed pong", m, err)
	}
	if c.Rejected() != 1 {
		t.Errorf("Rejected = %d, want 1", c.Rejected())
	}
	hostW.Close()
	guestW.Close()
}

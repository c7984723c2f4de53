// Command fakepolicyd runs the fake OpenAI-compatible policy server
// (package fakepolicy) in its own process, for tests written outside Go:
// the Python client's suite starts it beside `rollbox serve`.
//
//	fakepolicyd [--addr 127.0.0.1:0] [--script FILE.json] [--latency 0s]
//
// It prints "fakepolicy listening on URL" (the base URL, ending in /v1) on
// stdout once it listens, and serves until SIGTERM, SIGINT or the end of
// its standard input (so it cannot outlive a test runner that dies).
// --script plays a fakepolicy.ChoiceFile: per task prompt, a list of
// scripted conversations taken in turn. Without it every call is answered
// "ok".
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/internal/fakepolicy"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "`HOST:PORT` to listen on")
	script := flag.String("script", "", "a JSON `FILE` of scripted conversations (fakepolicy.ChoiceFile)")
	latency := flag.Duration("latency", 0, "added to every call")
	noTokenizer := flag.Bool("no-tokenizer", false, "answer /tokenize with 404, as a server without a tokenizer")
	flag.Parse()
	cfg := fakepolicy.Config{Addr: *addr, Latency: *latency, NoTokenizer: *noTokenizer}
	if *script != "" {
		data, err := os.ReadFile(*script)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fakepolicyd:", err)
			os.Exit(2)
		}
		f, err := fakepolicy.ParseChoiceFile(data)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fakepolicyd: %s: %v\n", *script, err)
			os.Exit(2)
		}
		cfg.Responder = fakepolicy.Choices(f)
	}
	srv, err := fakepolicy.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakepolicyd:", err)
		os.Exit(1)
	}
	fmt.Printf("fakepolicy listening on %s\n", srv.URL())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-stop:
	case <-eof:
	}
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

package wasm

import (
	"context"
	"fmt"

	"github.com/rollbox/rollbox/sandbox"
)

// Fork makes n sandboxes of this one's spec whose filesystems are
// copy-on-write clones of this one's (sandbox.Forker): O(1) each, sharing
// every file until one of them writes it. Nothing runs in an idle WASM
// sandbox, so there are no processes to leave behind.
//
// # Errors
//
// ErrInvalidSpec for n out of range; ErrClosed for a closed sandbox or
// backend.
func (s *Sandbox) Fork(ctx context.Context, n int) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckFork(n); err != nil {
		return nil, err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	s.b.mu.Lock()
	bclosed := s.b.closed
	s.b.mu.Unlock()
	if closed || bclosed {
		return nil, fmt.Errorf("fork %s: %w", s.id, sandbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fork %s: %w", s.id, err)
	}
	out := make([]sandbox.Sandbox, n)
	for i := range out {
		kid := newSandbox(s.b, s.spec)
		kid.fs = s.fs.Clone()
		s.b.live.Store(kid.id, kid)
		out[i] = kid
	}
	return out, nil
}

var _ sandbox.Forker = (*Sandbox)(nil)

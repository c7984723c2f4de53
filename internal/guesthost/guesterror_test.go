package guesthost

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

// The guest's error codes are translated at the backend's edge: what the
// request got wrong is the caller's (a tool reports it to the model), what
// the guest failed at itself is infrastructure (the episode is not scored).
// An internal error used to come back as a bare message, which the tools
// then reported as the model's bad_arguments.
func TestTheGuestsErrorsAreClassifiedAtTheEdge(t *testing.T) {
	c := New(Config{ID: "0123456789ab"})
	tests := []struct {
		code  string
		kind  error
		infra bool
	}{
		{guestproto.CodeNotFound, sandbox.ErrNotFound, false},
		{guestproto.CodePathEscape, sandbox.ErrPathEscape, false},
		{guestproto.CodeTooLarge, sandbox.ErrTooLarge, false},
		{guestproto.CodeInvalid, sandbox.ErrInvalidSpec, false},
		{guestproto.CodeDenied, fs.ErrPermission, false},
		{guestproto.CodeInternal, sandbox.ErrSandboxFailed, true},
		{"a-code-from-a-newer-guest", sandbox.ErrSandboxFailed, true},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			err := c.GuestError(&guestproto.Error{Code: tt.code, Message: "/work/x: what went wrong"})
			if !errors.Is(err, tt.kind) || sandbox.IsInfra(err) != tt.infra || sandbox.IsAbuse(err) {
				t.Errorf("%v: want %v, infrastructure %v", err, tt.kind, tt.infra)
			}
		})
	}
}

package guesthost

import (
	"fmt"
	"os"

	"github.com/rollbox/rollbox/sandbox"
)

// CheckGuest checks that path (a backend's Options.GuestPath, named field
// in the error) is the guest agent's executable file.
func CheckGuest(field, path string) error {
	if path == "" {
		return &sandbox.FieldError{Field: field, Message: "no guest agent binary given (images.Builder builds images/guest)"}
	}
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return &sandbox.FieldError{Field: field, Message: fmt.Sprintf("%s is not an executable file", path)}
	}
	return nil
}

package trajectory

import (
	"bytes"
	_ "embed"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// JSONSchema is the JSON Schema (draft 2020-12) of a trajectory document.
//
//go:embed schema.json
var JSONSchema []byte

var compiled = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(JSONSchema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("rollbox.trajectory.v1.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("rollbox.trajectory.v1.json")
})

// Validate checks a trajectory document against JSONSchema.
func Validate(doc []byte) error {
	s, err := compiled()
	if err != nil {
		return fmt.Errorf("trajectory schema: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("trajectory: not JSON: %w", err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("trajectory does not match %s: %w", Schema, err)
	}
	return nil
}

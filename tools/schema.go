package tools

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Schema is an OpenAI function-calling tool definition.
type Schema struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// param is the subset of JSON Schema the tools use: objects of typed
// properties, required names, no additional properties, bounds.
type param struct {
	Type                 string            `json:"type"`
	Description          string            `json:"description,omitempty"`
	Properties           map[string]*param `json:"properties,omitempty"`
	Required             []string          `json:"required,omitempty"`
	AdditionalProperties *bool             `json:"additionalProperties,omitempty"`
	Items                *param            `json:"items,omitempty"`
	Minimum              *float64          `json:"minimum,omitempty"`
	Maximum              *float64          `json:"maximum,omitempty"`
	MinLength            *int              `json:"minLength,omitempty"`
	MinItems             *int              `json:"minItems,omitempty"`
}

// validate checks args (a decoded JSON value) against p. The error names the
// offending argument.
func (p *param) validate(path string, v any) error {
	name := path
	if name == "" {
		name = "arguments"
	}
	switch p.Type {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s must be a JSON object, got %s", name, jsonType(v))
		}
		for _, r := range p.Required {
			if _, ok := obj[r]; !ok {
				return fmt.Errorf("missing required argument %q", join(path, r))
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sub, ok := p.Properties[k]
			if !ok {
				if p.AdditionalProperties != nil && !*p.AdditionalProperties {
					allowed := make([]string, 0, len(p.Properties))
					for a := range p.Properties {
						allowed = append(allowed, a)
					}
					sort.Strings(allowed)
					return fmt.Errorf("unknown argument %q (allowed: %s)", join(path, k), strings.Join(allowed, ", "))
				}
				continue
			}
			if err := sub.validate(join(path, k), obj[k]); err != nil {
				return err
			}
		}
	case "string":
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("argument %q must be a string, got %s", name, jsonType(v))
		}
		if p.MinLength != nil && len(s) < *p.MinLength {
			return fmt.Errorf("argument %q must not be empty", name)
		}
	case "integer", "number":
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("argument %q must be a %s, got %s", name, p.Type, jsonType(v))
		}
		if p.Type == "integer" && f != math.Trunc(f) {
			return fmt.Errorf("argument %q must be an integer, got %v", name, f)
		}
		if p.Minimum != nil && f < *p.Minimum {
			return fmt.Errorf("argument %q must be at least %v, got %v", name, *p.Minimum, f)
		}
		if p.Maximum != nil && f > *p.Maximum {
			return fmt.Errorf("argument %q must be at most %v, got %v", name, *p.Maximum, f)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("argument %q must be a boolean, got %s", name, jsonType(v))
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("argument %q must be an array, got %s", name, jsonType(v))
		}
		if p.MinItems != nil && len(arr) < *p.MinItems {
			return fmt.Errorf("argument %q must have at least %d item(s)", name, *p.MinItems)
		}
		if p.Items != nil {
			for i, e := range arr {
				if err := p.Items.validate(fmt.Sprintf("%s[%d]", name, i), e); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// object builds an object schema from properties; required lists the
// mandatory ones.
func object(props map[string]*param, required ...string) *param {
	no := false
	return &param{Type: "object", Properties: props, Required: required, AdditionalProperties: &no}
}

func str(desc string) *param {
	one := 1
	return &param{Type: "string", Description: desc, MinLength: &one}
}

// strAny is a string that may be empty.
func strAny(desc string) *param { return &param{Type: "string", Description: desc} }

func integer(desc string, lo, hi float64) *param {
	return &param{Type: "integer", Description: desc, Minimum: &lo, Maximum: &hi}
}

func strList(desc string) *param {
	one := 1
	return &param{Type: "array", Description: desc, Items: &param{Type: "string", MinLength: &one}}
}

package sandbox

// Find finds an optional capability of a backend or a sandbox: in v, or in
// what v wraps (a chain of Unwrap() W, as an audit log or a lease wraps a
// backend, an audit log a sandbox), the first value that is a T.
//
//	if in, ok := sandbox.Find[sandbox.Inspector](backend); ok { ... }
func Find[T, W any](v W) (T, bool) {
	var cur any = v
	for cur != nil {
		if t, ok := cur.(T); ok {
			return t, true
		}
		u, ok := cur.(interface{ Unwrap() W })
		if !ok {
			break
		}
		cur = u.Unwrap()
	}
	var zero T
	return zero, false
}

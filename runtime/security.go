package runtime

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// Tenants are the bearer tokens the service accepts (rollbox serve
// --auth-tokens FILE), each naming a tenant: every rollout and environment
// episode belongs to the tenant whose token created it, and is invisible
// and untouchable to the others (404, as if it did not exist).
type Tenants struct {
	byHash map[[sha256.Size]byte]string
}

var tenantRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// minTokenLen is the shortest token accepted: a token is a password.
const minTokenLen = 16

// LoadTenants reads a tokens file: one token a line, "TENANT TOKEN" (the
// tenant named; several tokens may share one) or "TOKEN" alone (the tenant
// is then named after the token's hash); blank lines and lines starting
// with # are ignored. Errors name the line.
func LoadTenants(path string) (*Tenants, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseTenants(f, path)
}

// ParseTenants reads a tokens file from r; name is used in errors.
func ParseTenants(r io.Reader, name string) (*Tenants, error) {
	t := &Tenants{byHash: map[[sha256.Size]byte]string{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		var tenant, token string
		switch len(fields) {
		case 1:
			token = fields[0]
			sum := sha256.Sum256([]byte(token))
			tenant = "t-" + hex.EncodeToString(sum[:6])
		case 2:
			tenant, token = fields[0], fields[1]
			if !tenantRe.MatchString(tenant) {
				return nil, fmt.Errorf("%s line %d: tenant %q: use letters, digits, '.', '_' and '-' (at most 64)", name, n, tenant)
			}
		default:
			return nil, fmt.Errorf("%s line %d: want \"TENANT TOKEN\" or \"TOKEN\"", name, n)
		}
		if len(token) < minTokenLen {
			return nil, fmt.Errorf("%s line %d: the token is %d characters; use at least %d (e.g. openssl rand -hex 32)", name, n, len(token), minTokenLen)
		}
		h := sha256.Sum256([]byte(token))
		if _, dup := t.byHash[h]; dup {
			return nil, fmt.Errorf("%s line %d: this token is also on an earlier line", name, n)
		}
		t.byHash[h] = tenant
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(t.byHash) == 0 {
		return nil, fmt.Errorf("%s: no token", name)
	}
	return t, nil
}

// tenant is the tenant of a bearer token, and whether the token is known.
// The token is compared by its SHA-256 (a map lookup of a hash the caller
// cannot steer byte by byte).
func (t *Tenants) tenant(token string) (string, bool) {
	name, ok := t.byHash[sha256.Sum256([]byte(token))]
	return name, ok
}

// Count is the number of tokens.
func (t *Tenants) Count() int { return len(t.byHash) }

type tenantKey struct{}

// tenantOf is the tenant a request was authenticated as ("" without
// --auth-tokens: everything is everybody's).
func tenantOf(r *http.Request) string { return tenantFrom(r.Context()) }

func tenantFrom(ctx context.Context) string {
	v, _ := ctx.Value(tenantKey{}).(string)
	return v
}

// LoopbackHosts are the host names a service listening on a loopback
// address answers to by default (Options.AllowedHosts): a page whose name
// resolves to 127.0.0.1 (DNS rebinding) is refused.
func LoopbackHosts() []string { return []string{"localhost", "127.0.0.1", "::1"} }

// guard checks a request before its handler runs, and returns it with its
// tenant:
//
//   - Host must be one of Options.AllowedHosts when they are set (a
//     browser page under an attacker's name resolving to this service);
//   - a request a browser sends from another origin (an Origin that is not
//     this Host, or Sec-Fetch-Site: cross-site) is refused: no page the
//     operator visits may drive the service; and nothing answers CORS;
//   - with Tenants, every route but /healthz and /openapi.json needs
//     "Authorization: Bearer TOKEN" (401 otherwise);
//   - a body is JSON, sent as Content-Type: application/json (or, to
//     /v1/imports, application/x-ndjson), so a browser cannot send it as a
//     "simple" cross-site request (415 otherwise).
func (s *Server) guard(r *http.Request, public bool) (*http.Request, error) {
	if hosts := s.opts.AllowedHosts; len(hosts) > 0 && !hostAllowed(r.Host, hosts) {
		return r, &apiError{Status: http.StatusForbidden, Code: codeForbidden,
			Message: fmt.Sprintf("Host %q is not one this service answers to (rollbox serve --allowed-hosts)", r.Host)}
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		return r, &apiError{Status: http.StatusForbidden, Code: codeForbidden,
			Message: fmt.Sprintf("requests from the web page origin %q are refused: this API is not for browsers", o)}
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return r, &apiError{Status: http.StatusForbidden, Code: codeForbidden,
			Message: "cross-site requests from a browser are refused: this API is not for browsers"}
	}
	if s.opts.Tenants != nil && !public {
		auth := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok {
			return r, &apiError{Status: http.StatusUnauthorized, Code: codeUnauthorized,
				Message: "this service needs \"Authorization: Bearer TOKEN\" (one of rollbox serve --auth-tokens)"}
		}
		tenant, ok := s.opts.Tenants.tenant(strings.TrimSpace(token))
		if !ok {
			return r, &apiError{Status: http.StatusUnauthorized, Code: codeUnauthorized, Message: "the bearer token is not one this service accepts"}
		}
		r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	}
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		ct := r.Header.Get("Content-Type")
		mt, _, err := mime.ParseMediaType(ct)
		if err == nil && mt == "application/x-ndjson" && r.URL.Path == "/v1/imports" {
			break // NDJSON is no more a "simple" cross-site request than JSON
		}
		if err != nil || mt != "application/json" {
			return r, &apiError{Status: http.StatusUnsupportedMediaType, Code: codeUnsupportedMedia, Field: "Content-Type",
				Message: fmt.Sprintf("the body must be JSON sent as Content-Type: application/json, not %q", ct)}
		}
	}
	return r, nil
}

// hostAllowed reports whether a Host header names one of hosts (any port).
func hostAllowed(hostport string, hosts []string) bool {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.Trim(strings.ToLower(h), "[]")
	for _, a := range hosts {
		if strings.EqualFold(strings.Trim(a, "[]"), h) || a == "*" {
			return true
		}
	}
	return false
}

// sameOrigin reports whether an Origin header is this service's own (its
// host and port are the request's Host).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

// ownedBy reports whether tenant may see something owned by owner.
func ownedBy(owner, tenant string) bool { return owner == tenant }

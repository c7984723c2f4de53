package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollbox/rollbox/runtime"
)

// newImportCmd is `rollbox import FILE --server URL`: production episodes
// (NDJSON of OpenAI chat-completions episodes or Rollbox trajectories) sent
// to a rollout service's POST /v1/imports, streamed from the file.
func newImportCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import FILE --server URL [flags]",
		Short: "Import production episodes (NDJSON) into a rollout service",
		Long: `Send production episodes to a rollout service (POST /v1/imports): an NDJSON file
(- for stdin) of OpenAI chat-completions episodes or Rollbox trajectories, one a
line, streamed. The service redacts secrets, stores each episode durably with
source production (or --source), deduplicates the caller's ids (resending a file
is safe: what was stored counts as duplicates) and answers what it took and, line
by line, what it refused and why. docs/production.md has the formats.

A 429 or 503 answer (the service busy or stopping) is retried after its
Retry-After, resending the whole file, up to --retries times (not from stdin).
The token is $ROLLBOX_TOKEN when the service needs one (--auth-tokens).

Exit status: 0 every line was stored (or was a duplicate), 2 some lines were
refused (the others were stored), 1 the import failed.`,
		Example: `  rollbox import sessions.ndjson --server http://127.0.0.1:7070
  rollbox import staging.ndjson --server http://127.0.0.1:7070 --source staging --policy-version v42 --json`,
		Args: cobra.ExactArgs(1),
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	server := fs.String("server", "", "the rollout service's `URL` (rollbox serve)")
	source := fs.String("source", "", "the episodes' source label (default production)")
	policyVersion := fs.String("policy-version", "", "the deployment's policy `VERSION`, for lines that carry none")
	groupBy := fs.String("group-by", "", "group_id, task_id or prompt (default: the line's group_id, else task_id, else the normalized prompt)")
	retries := fs.Int("retries", 5, "retries of a 429 or 503 answer (the whole file is resent: it is idempotent)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON on stdout")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *server == "" {
			return usagef("--server URL is required (the rollout service, e.g. http://127.0.0.1:7070)")
		}
		base, err := url.Parse(*server)
		if err != nil || base.Scheme != "http" && base.Scheme != "https" || base.Host == "" {
			return usagef("--server %q is not an http(s) URL", *server)
		}
		q := url.Values{}
		for k, v := range map[string]string{"source": *source, "policy_version": *policyVersion, "group_by": *groupBy} {
			if v != "" {
				q.Set(k, v)
			}
		}
		target := strings.TrimSuffix(base.String(), "/") + "/v1/imports"
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		var body io.ReadSeeker
		if args[0] == "-" {
			body = nil
		} else {
			f, err := os.Open(args[0])
			if err != nil {
				return usagef("%v", err)
			}
			defer f.Close()
			body = f
		}
		res, err := postImport(cmd.Context(), env, target, body, *retries)
		if err != nil {
			return err
		}
		if *asJSON {
			b, _ := json.MarshalIndent(res, "", "  ")
			fmt.Fprintln(env.stdout, string(b))
		}
		fmt.Fprintf(env.stderr, "rollbox import: %d stored, %d duplicates, %d refused (%d lines, %s)\n",
			res.Accepted, res.Duplicates, res.RejectedCount, res.Lines, humanBytes(res.Bytes))
		for _, r := range res.Rejected {
			field := r.Field
			if field == "" {
				field = "(line)"
			}
			fmt.Fprintf(env.stderr, "  line %d: %s: %s\n", r.Line, field, r.Message)
		}
		if res.RejectedCount > len(res.Rejected) {
			fmt.Fprintf(env.stderr, "  ... and %d more refused lines\n", res.RejectedCount-len(res.Rejected))
		}
		if res.RejectedCount > 0 {
			return &exitError{code: exitBadInput}
		}
		return nil
	}
	return cmd
}

// postImport sends the file (stdin when body is nil), retrying 429 and 503
// after their Retry-After by resending it from the start.
func postImport(ctx context.Context, env *cliEnv, target string, body io.ReadSeeker, retries int) (*runtime.ImportResult, error) {
	for attempt := 0; ; attempt++ {
		var rd io.Reader = env.stdin
		if body != nil {
			if _, err := body.Seek(0, io.SeekStart); err != nil {
				return nil, err
			}
			rd = body
		}
		req, err := http.NewRequestWithContext(ctx, "POST", target, rd)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		if tok := os.Getenv("ROLLBOX_TOKEN"); tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("POST %s: %w", target, err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("POST %s: reading the answer: %w", target, err)
		}
		if resp.StatusCode == http.StatusOK {
			var res runtime.ImportResult
			if err := json.Unmarshal(raw, &res); err != nil {
				return nil, fmt.Errorf("POST %s: the answer is not an import result: %v", target, err)
			}
			return &res, nil
		}
		var e struct {
			Error struct{ Code, Message, Field string }
		}
		json.Unmarshal(raw, &e)
		msg := fmt.Sprintf("the service answered %d: %s", resp.StatusCode, e.Error.Message)
		if e.Error.Field != "" {
			msg = fmt.Sprintf("the service answered %d: %s: %s", resp.StatusCode, e.Error.Field, e.Error.Message)
		}
		retryable := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
		if !retryable || body == nil || attempt >= retries {
			if resp.StatusCode == http.StatusBadRequest {
				return nil, usagef("%s", msg)
			}
			return nil, fmt.Errorf("%s", msg)
		}
		wait := 2 * time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		fmt.Fprintf(env.stderr, "rollbox import: %s; resending in %s\n", msg, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// humanBytes writes a size for people.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

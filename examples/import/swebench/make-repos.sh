#!/usr/bin/env bash
# Makes the repositories examples/import/swebench/instances.jsonl names, in
# DIR: git repositories DIR/acme__calc and DIR/acme__textkit whose first
# commit is the instance's base_commit (fixed identity and dates, so the
# hashes are always the same) and whose second applies the gold patch (an
# importer that took HEAD instead of base_commit would hand the agent the
# fix), and the workspace directory DIR/acme__intervals-3 (no git).
#
#   bash examples/import/swebench/make-repos.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: make-repos.sh DIR}"
mkdir -p "$out"
export GIT_AUTHOR_NAME="Rollbox tests" GIT_AUTHOR_EMAIL="tests@rollbox.invalid"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_SYSTEM=/dev/null
for repo in acme__calc acme__textkit; do
  d="$out/$repo"
  rm -rf "$d"
  cp -r "$here/src/$repo" "$d"
  git -C "$d" init -q -b main
  git -C "$d" add -A
  GIT_AUTHOR_DATE="2024-01-01T00:00:00Z" GIT_COMMITTER_DATE="2024-01-01T00:00:00Z" git -C "$d" commit -q -m "base"
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    i = json.loads(line)
    if i["repo"] == sys.argv[2]:
        sys.stdout.write(i["patch"])' "$here/instances.jsonl" "${repo/__//}" | git -C "$d" apply -
  git -C "$d" add -A
  GIT_AUTHOR_DATE="2024-01-02T00:00:00Z" GIT_COMMITTER_DATE="2024-01-02T00:00:00Z" git -C "$d" commit -q -m "fix (after the base commit)"
  echo "$d: base $(git -C "$d" rev-parse HEAD~1), HEAD $(git -C "$d" rev-parse HEAD)"
done
rm -rf "$out/acme__intervals-3"
cp -r "$here/src/acme__intervals" "$out/acme__intervals-3"
echo "$out/acme__intervals-3: a workspace directory"

#!/usr/bin/env bash
# Installs (from Debian's packages) what the Python client's tests need:
# python3, pytest and mypy. `go test ./clients/python` runs them; under
# CI=true it fails rather than skips without them. Safe to run twice.
set -euo pipefail

need=()
[ -x /usr/bin/python3 ] || need+=(python3)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
/usr/bin/python3 -c 'import mypy' 2>/dev/null || need+=(python3-mypy)
if [ ${#need[@]} -gt 0 ]; then
  echo "python: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
/usr/bin/python3 -m pytest --version >&2

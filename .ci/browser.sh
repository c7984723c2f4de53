#!/usr/bin/env bash
# Installs Debian's chromium for the trajectory viewer's browser test
# (internal/inspect, driven over CDP by chromedp; under CI=true it must not
# skip). Safe to run twice.
set -euo pipefail

if ! command -v chromium >/dev/null; then
  echo "browser: installing chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
echo "browser: chromium $(dpkg-query -W -f='${Version}' chromium)" >&2

#!/bin/sh
# Recipe "python": a minimal Debian bookworm rootfs with python3, pytest and
# git, made by debootstrap from the Debian mirror apt uses on this host (read
# from /etc/apt/sources.list*, never hard-coded). Run as root by
# `rollbox images build python` with the empty rootfs directory as $1; takes
# about a minute and ~400 MB. Needs debootstrap on the host.
set -eu
root=$1

mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/ && $i !~ /security/) { print $i; exit } }' | head -n 1)
fi
if [ -z "$mirror" ]; then
  echo "recipe python: no Debian mirror found in /etc/apt/sources.list*" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "recipe python: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

echo "recipe python: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-pytest,git bookworm "$root" "$mirror" >&2

mkdir -p "$root/work"
chmod 1777 "$root/tmp"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log

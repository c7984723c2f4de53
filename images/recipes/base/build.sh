#!/bin/sh
# Recipe "base": a tiny rootfs from Debian's busybox-static. Run as root by
# `rollbox images build base` with the empty rootfs directory as $1; the
# directory is then imported as a docker image (no registry).
#
# Contents: /bin/busybox and a symlink per applet (sh, ls, cat, wget, nc, ...),
# /etc/passwd and /etc/group with root and nobody (65534), /tmp (1777) and
# /work. Needs the busybox-static package on the host (.ci/engine.sh installs it).
set -eu
root=$1

bb=$(dpkg -L busybox-static 2>/dev/null | grep -E '/bin/busybox$' | head -n 1 || true)
if [ -z "$bb" ] || [ ! -x "$bb" ]; then
  echo "recipe base: Debian's busybox-static is not installed (apt-get install busybox-static)" >&2
  exit 1
fi

mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/etc" "$root/tmp" "$root/work" "$root/root"
cp "$bb" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list-full); do
  [ -e "$root/$applet" ] || [ -L "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done

cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/sh
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP
chmod 1777 "$root/tmp"
chmod 0755 "$root/work"

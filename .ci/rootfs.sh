#!/bin/sh
# Gathers what the idem image holds into a folder (the Containerfile's build stage runs it
# on the Rust image; CI runs it on this machine for a binary it already built):
#   sh .ci/rootfs.sh BINARY DEST
# DEST gets usr/local/bin/idem, /bin/sh (dash), sleep, grep and sed for command jobs'
# watchdog (grep and sed find what left the program's group by its IDEM_RUN_ID), the
# shared libraries they load (as ldd lists them), the CA certificates, an `idem` user
# (10001) and its writable home /var/lib/idem, and /tmp.
set -eu
bin=$1
dest=$2
mkdir -p "$dest/usr/local/bin" "$dest/bin" "$dest/etc/ssl/certs" "$dest/var/lib/idem" "$dest/tmp" "$dest/app" "$dest/dev" "$dest/proc"
cp "$bin" "$dest/usr/local/bin/idem"
strip "$dest/usr/local/bin/idem" 2>/dev/null || true
cp "$(command -v dash)" "$dest/bin/sh"
for tool in sleep grep sed; do
    cp "$(command -v "$tool")" "$dest/bin/$tool"
done
for lib in $(ldd "$bin" "$(command -v dash)" "$(command -v sleep)" "$(command -v grep)" "$(command -v sed)" | grep -o '/[^ ]*' | sort -u); do
    case "$lib" in *:) continue ;; esac
    # Keep the path the binaries ask for (the interpreter's own path included).
    mkdir -p "$dest$(dirname "$lib")"
    cp -L "$lib" "$dest$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$dest/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nidem:x:10001:10001:idem:/var/lib/idem:/sbin/nologin\n' > "$dest/etc/passwd"
printf 'root:x:0:\nidem:x:10001:\n' > "$dest/etc/group"
chown 10001:10001 "$dest/var/lib/idem"
chmod 1777 "$dest/tmp"

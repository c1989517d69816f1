#!/usr/bin/env bash
# The images' base: Debian minbase with Debian's python3, made by debootstrap (no image
# registry pull), imported into buildah's storage as localhost/kcops-base:<hash of this
# script>. Cached twice under that key: the image in buildah's (vfs) storage and its root
# filesystem as a tar in $KCOPS_IMAGE_CACHE (outside the work tree), so a change here, and
# only here, makes a new base. Prints the image name. Installs buildah and debootstrap
# with apt-get when they are missing (as root).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${KCOPS_IMAGE_CACHE:-/var/cache/kcops-images}
BUILDAH=(buildah --storage-driver vfs)
export BUILDAH_ISOLATION=chroot

say() { echo "images: $*" >&2; }
have_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

tools() {
    local missing=""
    command -v buildah >/dev/null || missing="$missing buildah"
    command -v debootstrap >/dev/null || missing="$missing debootstrap"
    if [ -n "$missing" ]; then
        say "installing:$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
    fi
}

build_base() {
    local key name tar root ctr t0
    key=$(sha256sum "$HERE/base.sh" | cut -c1-12)
    name=localhost/kcops-base:$key
    if have_image "$name"; then echo "$name"; return; fi
    mkdir -p "$CACHE"
    tar=$CACHE/base-$key.tar
    if [ ! -f "$tar" ]; then
        t0=$(date +%s)
        root=$CACHE/rootfs-$key
        rm -rf "$root"
        say "debootstrap $SUITE minbase + python3 into $root"
        debootstrap --variant=minbase --include=python3 "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap-$key.log" 2>&1 \
            || { tail -n 20 "$CACHE/debootstrap-$key.log" >&2; exit 1; }
        # What an image never needs at run time: package caches, docs, man pages, locales.
        rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
            "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
            "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
        tar --numeric-owner -C "$root" -cf "$tar.part" .
        mv "$tar.part" "$tar"
        rm -rf "$root"
        say "base made in $(( $(date +%s) - t0 )) s"
    fi
    ctr=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" add "$ctr" "$tar" / >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
    echo "$name"
}

tools
build_base

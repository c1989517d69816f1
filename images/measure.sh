#!/usr/bin/env bash
# The sidecar image's size and its time from start to /healthz, for docs/deploy.md.
#
# Usage: images/measure.sh [RUNS]   (default 5; the image: localhost/kcops:<version>)
# Size: buildah's (the unpacked layers) and the OCI archive's (gzip layers, what a
# registry stores). Start: the wall time from `buildah run` of `kcops agent run` (as the
# agent's UID, host network, the volumes deploy/ mounts as empty folders) to the first
# 200 from /healthz, polled every 20 ms with curl; each run in a fresh working container.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${1:-5}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO/kcops/__init__.py")
IMAGE=localhost/kcops:$VERSION
BUILDAH=(buildah --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "image: $IMAGE"
echo "size (buildah images): $("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE" | head -n 1)"
"${BUILDAH[@]}" push --quiet "$IMAGE" "oci-archive:$work/image.tar" >/dev/null
echo "size (OCI archive, gzip layers): $(du -m "$work/image.tar" | cut -f1) MiB"
rm -f "$work/image.tar"

port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
times=()
for i in $(seq "$RUNS"); do
    for d in run state tmp; do mkdir -p "$work/$i/$d"; chown 10002:10001 "$work/$i/$d"; done
    ctr=$("${BUILDAH[@]}" from --quiet "$IMAGE")
    t0=$(date +%s%N)
    "${BUILDAH[@]}" run --network host --user 10002:10001 -v "$work/$i/run:/run/kcops" \
        -v "$work/$i/state:/var/lib/kcops" -v "$work/$i/tmp:/tmp" "$ctr" -- \
        kcops agent run --listen "127.0.0.1:$port" --state-dir /var/lib/kcops \
        >"$work/agent-$i.log" 2>&1 &
    pid=$!
    until curl -sf -o /dev/null "http://127.0.0.1:$port/healthz"; do
        kill -0 "$pid" 2>/dev/null || { cat "$work/agent-$i.log"; exit 1; }
        sleep 0.02
    done
    t1=$(date +%s%N)
    times+=("$(( (t1 - t0) / 1000000 ))")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
echo "start to /healthz (ms, $RUNS runs): $(echo "$sorted" | tr '\n' ' ')"
echo "median: $(echo "$sorted" | sed -n "$(( (RUNS + 1) / 2 ))p") ms"

#!/usr/bin/env bash
# `make release`: dist/ with the wheel and sdist, the images as OCI archives, the rendered
# manifests, a CycloneDX SBOM of each image's Python packages, and SHA256SUMS; then the
# listing (every artifact, its size and checksum).
#
# The wheel and sdist are built with SOURCE_DATE_EPOCH = the last commit's time, so an
# unchanged checkout gives the same bytes (docs/deploy.md, "Releases"). The images are
# (re)built by images/build.sh, which keeps an image whose build key (its wheel's checksum
# and the image scripts) has not changed.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
HERE=$REPO/images
DIST=$REPO/dist
PY=${PY:-$REPO/.venv/bin/python}
RESOLVE_PY=${RESOLVE_PY:-/usr/bin/python3}
CACHE=${KCOPS_IMAGE_CACHE:-/var/cache/kcops-images}
REGISTRY=ghcr.io/kcops
# The maintained CycloneDX generator for Python environments (PyPI cyclonedx-bom).
CYCLONEDX=${CYCLONEDX:-cyclonedx-bom==7.*}
BUILDAH=(buildah --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO/kcops/__init__.py")
say() { echo "release: $*" >&2; }

rm -rf "$DIST" && mkdir -p "$DIST" "$REPO/build"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct)}
say "wheel and sdist (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
"$PY" -m build --sdist --wheel --outdir "$DIST" "$REPO" >"$REPO/build/release-build.log" 2>&1 \
    || { tail -n 20 "$REPO/build/release-build.log" >&2; exit 1; }

# setuptools stamps the sdist's folders, generated files (PKG-INFO, egg-info) and gzip
# header with the build's time, and the other files with the checkout's: set every time
# to SOURCE_DATE_EPOCH (owners 0, names sorted) so the sdist is reproducible as the
# wheel already is. Contents are unchanged.
"$PY" - "$DIST"/kcops-"$VERSION".tar.gz "$SOURCE_DATE_EPOCH" <<'PY'
import gzip, io, sys, tarfile
path, epoch = sys.argv[1], int(sys.argv[2])
with tarfile.open(path) as src:
    members = sorted(((m, src.extractfile(m).read() if m.isfile() else None) for m in src),
                     key=lambda x: x[0].name)
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
    for m, data in members:
        m.mtime = epoch
        m.uid = m.gid = 0
        m.uname = m.gname = ""
        m.pax_headers = {}
        dst.addfile(m, io.BytesIO(data) if data is not None else None)
with open(path, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=epoch) as gz:
    gz.write(buf.getvalue())
PY

say "images"
bash "$HERE/build.sh" kcops
bash "$HERE/build.sh" engine

# The generator, installed for Debian's python3 (the images' interpreter), run inside each
# image against the image's own environment (/opt/kcops/bin/python).
tool=$CACHE/sbom-$(echo "$CYCLONEDX" | sha256sum | cut -c1-12)
if [ ! -d "$tool/cyclonedx_py" ]; then
    pipwhl=$(ls "$CACHE"/wheels/pip-*.whl | sort -V | tail -n 1)
    rm -rf "$tool.part"
    "$RESOLVE_PY" "$pipwhl/pip" install --quiet --disable-pip-version-check --no-compile \
        --target "$tool.part" "$CYCLONEDX" 2> >(grep -v "is ignored: it is neither" >&2 || true)
    mv "$tool.part" "$tool"
fi

for name in kcops kcops-engine; do
    image=localhost/$name:$VERSION
    say "$image: OCI archive and SBOM"
    "${BUILDAH[@]}" push --quiet "$image" "oci-archive:$DIST/$name-$VERSION.oci.tar:$REGISTRY/$name:$VERSION"
    ctr=$("${BUILDAH[@]}" from --quiet "$image")
    # The generator must not see its own packages in the environment it reads: it runs
    # from /sbom by sys.path, and the python it inspects starts with no PYTHONPATH.
    "${BUILDAH[@]}" run --user 0:0 -v "$tool:/sbom:ro" -v "$DIST:/dist" "$ctr" -- \
        /usr/bin/python3 -c "import runpy, sys; sys.path.insert(0, '/sbom'); \
sys.argv[0] = 'cyclonedx-py'; runpy.run_module('cyclonedx_py', run_name='__main__')" \
        environment --output-format JSON --output-reproducible \
        --output-file "/dist/$name-$VERSION.cdx.json" /opt/kcops/bin/python
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
done

say "manifests"
for overlay in vllm kcops-worker; do
    kubectl kustomize "$REPO/deploy/overlays/$overlay" >"$DIST/kcops-$VERSION-$overlay.yaml"
done
kubectl kustomize "$REPO/deploy/cluster" >"$DIST/kcops-$VERSION-cluster.yaml"

(cd "$DIST" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort \
    | xargs sha256sum >SHA256SUMS)
echo "dist/ ($VERSION):"
(cd "$DIST" && while read -r sum file; do
    printf '  %-44s %8s  sha256:%s\n' "$file" "$(du -h "$file" | cut -f1)" "$sum"
done <SHA256SUMS)

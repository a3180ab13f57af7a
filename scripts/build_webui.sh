#!/usr/bin/env bash
# Vendors the web page's two libraries into src/server/webui/vendor/: marked
# (Markdown to HTML) and DOMPurify (sanitizes that HTML), at pinned versions,
# with their licenses. The output is committed, so neither the build nor CI
# needs npm; run this only to change a version (then commit what it wrote).
# `npm pack` checks each tarball against the registry's integrity hash.
set -euo pipefail
cd "$(dirname "$0")/.."

MARKED_VERSION=18.2.1
DOMPURIFY_VERSION=3.4.18
OUT=src/server/webui/vendor

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "marked@$MARKED_VERSION" "dompurify@$DOMPURIFY_VERSION" >/dev/null)
mkdir -p "$work/marked" "$work/dompurify"
tar xzf "$work/marked-$MARKED_VERSION.tgz" -C "$work/marked"
tar xzf "$work/dompurify-$DOMPURIFY_VERSION.tgz" -C "$work/dompurify"

mkdir -p "$OUT"
# Both files are the packages' own minified browser builds (UMD: they define
# the globals `marked` and `DOMPurify`); only the source-map comment goes, as
# the maps are not shipped.
sed '/^\/\/# sourceMappingURL=/d' "$work/marked/package/lib/marked.umd.js" >"$OUT/marked.min.js"
sed '/^\/\/# sourceMappingURL=/d' "$work/dompurify/package/dist/purify.min.js" >"$OUT/purify.min.js"
cp "$work/marked/package/LICENSE" "$OUT/LICENSE-marked.txt"
cp "$work/dompurify/package/LICENSE" "$OUT/LICENSE-dompurify.txt"
cat >"$OUT/VERSIONS" <<VERSIONS
marked $MARKED_VERSION (MIT) lib/marked.umd.js -> marked.min.js
dompurify $DOMPURIFY_VERSION (Apache-2.0, one of its two licenses) dist/purify.min.js -> purify.min.js
made by scripts/build_webui.sh
VERSIONS
echo "vendored marked $MARKED_VERSION and DOMPurify $DOMPURIFY_VERSION into $OUT"

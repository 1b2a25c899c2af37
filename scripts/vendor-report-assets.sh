#!/usr/bin/env bash
# Re-vendor the HTML report's JavaScript libraries from npm into
# src/stepscope/report/assets/vendor/ (built dist files and licences only).
# The versions are pinned here; after a change, update assets/vendor/README.md and
# VENDOR_SCRIPTS in src/stepscope/report/html.py (load order), then run the browser test.
set -euo pipefail

UPLOT=1.6.32
FLAME=5.0.0
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/src/stepscope/report/assets/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --no-audit --no-fund --ignore-scripts "uplot@$UPLOT" "d3-flame-graph@$FLAME" >/dev/null
copy() {  # package, dist files...
  local pkg=$1
  shift
  rm -rf "${dest:?}/$pkg"
  mkdir -p "$dest/$pkg"
  for f in "$@"; do cp "node_modules/$pkg/dist/$f" "$dest/$pkg/"; done
  cp "node_modules/$pkg/LICENSE" "$dest/$pkg/LICENSE"
  node -e "const p=require('./node_modules/$pkg/package.json');console.log(p.name+'@'+p.version+' '+p.license)"
}
copy uplot uPlot.iife.min.js uPlot.min.css
copy d3-flame-graph d3-flamegraph.umd.min.js
for m in array dispatch ease color interpolate timer selection transition format time \
    time-format scale hierarchy; do
  copy "d3-$m" "d3-$m.min.js"
done
# internmap is bundled inside d3-array.min.js: keep its licence beside it
cp node_modules/internmap/LICENSE "$dest/d3-array/LICENSE-internmap"
node -e "const p=require('./node_modules/internmap/package.json');console.log(p.name+'@'+p.version+' '+p.license+' (inside d3-array.min.js)')"

#!/usr/bin/env bash
# package.sh — build the Debian packages dspark, dspark-edge, dspark-center
# and (in a build with CUDA) dspark-center-cuda from a configured, built tree
# (cpack -G DEB; Depends via dpkg-shlibdeps).
# Usage: deploy/package.sh [BUILD_DIR] [OUT_DIR]   (default build, BUILD_DIR/packages)
set -euo pipefail
build=${1:-build}
out=${2:-$build/packages}
targets="ds_doc dspark dspark-edge dspark-center"
grep -q '^dspark-cuda' <(cmake --build "$build" --target help 2>/dev/null | sed 's/^\.\.\. //') && targets+=" dspark-cuda"
cmake --build "$build" --target $targets >/dev/null
mkdir -p "$out"
(cd "$build" && cpack -G DEB -B "$(realpath "$out")" >/dev/null)
rm -rf "$out/_CPack_Packages"
ls "$out"/*.deb

#!/usr/bin/env bash
# package.sh — build the Debian packages dspark, dspark-edge and dspark-center
# from a configured, built tree (cpack -G DEB; Depends via dpkg-shlibdeps).
# Usage: deploy/package.sh [BUILD_DIR] [OUT_DIR]   (default build, BUILD_DIR/packages)
set -euo pipefail
build=${1:-build}
out=${2:-$build/packages}
cmake --build "$build" --target ds_doc dspark dspark-edge dspark-center >/dev/null
mkdir -p "$out"
(cd "$build" && cpack -G DEB -B "$(realpath "$out")" >/dev/null)
rm -rf "$out/_CPack_Packages"
ls "$out"/*.deb

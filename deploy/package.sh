#!/usr/bin/env bash
# package.sh — build the Debian packages dspark, dspark-edge, dspark-center,
# dspark-broker-config, (in a build with CUDA) dspark-center-cuda and the
# programs' -dbgsym .ddeb from a configured, built tree (cpack -G DEB; Depends
# via dpkg-shlibdeps), then run lintian on each where it is installed: an
# error fails the build; what is overridden is justified in
# deploy/debian/*.lintian-overrides (installed with the packages; the
# -dbgsym packages' on lintian's command line: they may hold debug files only).
# The maintainer field: cmake -DDS_PACKAGE_MAINTAINER="Name <mail>" BUILD_DIR.
# Usage: deploy/package.sh [BUILD_DIR] [OUT_DIR]   (default build, BUILD_DIR/packages)
#   DS_LINTIAN=0  skip lintian (the deploy tests that only install the packages)
set -euo pipefail
build=${1:-build}
out=${2:-$build/packages}
targets="ds_doc dspark dspark-edge dspark-center"
grep -q '^dspark-cuda' <(cmake --build "$build" --target help 2>/dev/null | sed 's/^\.\.\. //') && targets+=" dspark-cuda"
cmake --build "$build" --target $targets >/dev/null
mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.ddeb
(cd "$build" && cpack -G DEB -B "$(realpath "$out")" >/dev/null)
rm -rf "$out/_CPack_Packages"

# CPack's -dbgsym packages made as dh_strip makes them: md5sums of the files
# as installed (CPack 3.25 writes its staging paths there) and the doc folder
# a link to the package's own (copyright, changelog).
for dd in "$out"/*.ddeb; do
  [ -e "$dd" ] || continue
  d=$(mktemp -d)
  dpkg-deb -R "$dd" "$d/r"
  pkg=$(dpkg-deb -f "$dd" Package)
  mkdir -p "$d/r/usr/share/doc"
  ln -s "${pkg%-dbgsym}" "$d/r/usr/share/doc/$pkg"
  (cd "$d/r" && find usr -type f -exec md5sum {} + | LC_ALL=C sort -k2) > "$d/r/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -b "$d/r" "$dd" >/dev/null
  rm -rf "$d"
done
ls "$out"/*.deb "$out"/*.ddeb

if [ "${DS_LINTIAN:-1}" != 0 ] && command -v lintian >/dev/null; then
  # --fail-on error: warnings are reported; the ones kept are overridden with
  # their reason in deploy/debian/*.lintian-overrides
  rc=0
  lintian --no-cfg --fail-on error --suppress-tags-from-file "$(dirname "$0")/debian/dbgsym.lintian-overrides" \
          "$out"/*.deb "$out"/*.ddeb >"$out/lintian.log" 2>&1 || rc=$?
  grep -v 'running with root privileges' "$out/lintian.log" || true
  [ $rc = 0 ] || { echo "package.sh: lintian: errors (above; $out/lintian.log)" >&2; exit 1; }
  echo "lintian: no errors in $(ls "$out"/*.deb "$out"/*.ddeb | wc -l) packages"
fi

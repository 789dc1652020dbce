#!/usr/bin/env bash
# deploy.packages — build the .deb packages (deploy/package.sh), unpack each
# with dpkg -x into a scratch root and check: the files in FHS places, the
# conffiles, the Depends (dpkg-shlibdeps; nothing CUDA for the edge, the CLI
# or the center), the CUDA module in its own package (in a build with CUDA)
# found by the unpacked dspark-center, the units and man pages; then run the postinst with stub commands
# (getent, adduser, chown, ... log what they are asked) to check that it
# creates the dspark system user and /var/lib/dspark, and does so once, and
# enables and starts the unit through deb-systemd-helper/-invoke (restart on
# an upgrade). package.sh runs lintian here (0 errors) where it is installed.
# Skips (77) without dpkg-deb / cpack. Usage: packages.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
for t in dpkg-deb cpack dpkg-shlibdeps; do command -v $t >/dev/null || { echo "no $t: skipped"; exit 77; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
bash "$src/deploy/package.sh" "$build" "$tmp/pkgs" || fail "package.sh"
root=$tmp/root
for p in dspark dspark-edge dspark-center dspark-broker-config; do
  deb=$(ls "$tmp"/pkgs/${p}_*.deb 2>/dev/null) || fail "no $p package"
  echo "== $p: $(dpkg-deb -f "$deb" Depends)"
  dpkg-deb -x "$deb" "$root" || fail "dpkg -x $p"
  dpkg-deb -e "$deb" "$tmp/ctl-$p" || fail "dpkg -e $p"
  dpkg-deb -c "$deb" | awk '{print $6}' | grep -vE '^\./(usr/(bin|share/(man|doc|bash-completion|zsh/vendor-completions|lintian/overrides))|etc/dspark|etc/mosquitto/conf\.d|lib/systemd/system)(/|$)|^\./(usr/share|usr|etc|etc/mosquitto|lib|lib/systemd|usr/share/zsh|usr/share/lintian)?/?$' \
    && fail "$p installs outside the FHS places above"
  [ -f "$root/usr/share/doc/$p/copyright" ] || fail "$p has no copyright file"
  [ -f "$root/usr/share/doc/$p/changelog.Debian.gz" ] || fail "$p has no changelog.Debian.gz"
  dpkg-deb -f "$deb" Maintainer | grep -q '@localhost' && fail "$p's maintainer is on localhost"
  [ "$(dpkg-deb -f "$deb" Description | wc -l)" -gt 2 ] || fail "$p has no extended description"
done
[ "$(dpkg-deb -f "$tmp"/pkgs/dspark-broker-config_*.deb Architecture)" = all ] || fail "dspark-broker-config is not Architecture: all"
for p in dspark dspark-edge dspark-center; do
  ls "$tmp"/pkgs/${p}-dbgsym_*.ddeb >/dev/null 2>&1 || fail "no $p-dbgsym"
  f=$(dpkg-deb -c "$tmp"/pkgs/${p}_*.deb | awk '$6 ~ /^\.\/usr\/bin\// {print $6}')
  file "$root/${f#./}" | grep -q 'not stripped' && fail "$p ships an unstripped $f"
done
# The CUDA backend: its own package, one module under /usr/lib/<arch>/dspark,
# tied to the center's version; the center only recommends it.
cuda=$(ls "$tmp"/pkgs/dspark-center-cuda_*.deb 2>/dev/null)
if [ -n "$cuda" ]; then
  echo "== dspark-center-cuda: $(dpkg-deb -f "$cuda" Depends)"
  dpkg-deb -c "$cuda" | awk '{print $6}' | grep -vE '^\./usr/lib/[a-z0-9_-]+/dspark/dspark-cuda\.so$|^\./(usr|usr/lib|usr/lib/[a-z0-9_-]+|usr/lib/[a-z0-9_-]+/dspark)?/?$' \
    | grep -vE '^\./usr/share(/doc(/dspark-center-cuda(/(copyright|changelog\.Debian\.gz))?)?|/lintian(/overrides(/dspark-center-cuda)?)?)?/$|^\./usr/share/(doc/dspark-center-cuda/(copyright|changelog\.Debian\.gz)|lintian/overrides/dspark-center-cuda)$' \
    && fail "dspark-center-cuda installs more than its module (and its copyright, changelog, overrides)"
  dpkg-deb -f "$cuda" Depends | grep -q 'dspark-center (= ' || fail "dspark-center-cuda does not depend on its dspark-center"
  dpkg-deb -f "$tmp"/pkgs/dspark-center_*.deb Recommends | grep -q dspark-center-cuda || fail "dspark-center does not recommend dspark-center-cuda"
  dpkg-deb -x "$cuda" "$root" || fail "dpkg -x dspark-center-cuda"
  v=$(DSPARK_GPU_MODULE= "$root/usr/bin/dspark-center" --version) || fail "installed dspark-center --version"
  echo "$v"
  echo "$v" | grep -q "GPU module $root/usr/bin/../lib/[a-z0-9_-]*/dspark/dspark-cuda.so (cuda)" \
    || fail "the unpacked dspark-center does not load the unpacked module"
else
  echo "== no dspark-center-cuda (this build has no CUDA)"
  "$root/usr/bin/dspark-center" --version | grep -q "no GPU module" || fail "dspark-center --version without the module"
fi
for f in usr/bin/dspark usr/bin/dspark-edge usr/bin/dspark-center usr/share/man/man1/dspark.1.gz \
         usr/share/man/man8/dspark-edge.8.gz usr/share/man/man8/dspark-center.8.gz usr/share/man/man5/dspark.ini.5.gz \
         usr/share/bash-completion/completions/dspark usr/share/zsh/vendor-completions/_dspark \
         etc/mosquitto/conf.d/dspark.conf etc/dspark/edge.ini etc/dspark/center.ini \
         lib/systemd/system/dspark-edge.service lib/systemd/system/dspark-center.service; do
  [ -e "$root/$f" ] || fail "missing /$f"
done
bash -n "$root/usr/share/bash-completion/completions/dspark" || fail "completion syntax"
grep -qx /etc/dspark/edge.ini "$tmp/ctl-dspark-edge/conffiles" || fail "edge.ini is not a conffile"
grep -qx /etc/dspark/center.ini "$tmp/ctl-dspark-center/conffiles" || fail "center.ini is not a conffile"
grep -qx /etc/mosquitto/conf.d/dspark.conf "$tmp/ctl-dspark-broker-config/conffiles" || fail "the drop-in is not a conffile"
[ -e "$root/etc/dspark/mosquitto" ] && fail "/etc/dspark/mosquitto is back (mosquitto does not read it)"
# man -l renders each page with its sections
for m in man1/dspark.1 man8/dspark-edge.8 man8/dspark-center.8 man5/dspark.ini.5; do
  txt=$(MANWIDTH=80 man -l "$root/usr/share/man/$m.gz" 2>"$tmp/manerr") || fail "man -l $m"
  [ -s "$tmp/manerr" ] && fail "man -l $m: $(cat "$tmp/manerr")"
  secs="NAME SYNOPSIS DESCRIPTION FILES EXAMPLES SEE.ALSO"
  [ "$m" = man5/dspark.ini.5 ] || secs+=" OPTIONS ENVIRONMENT EXIT.STATUS"
  for sec in $secs; do echo "$txt" | grep -qx "$sec" || fail "$m has no $sec section"; done
  echo "$txt" | sed -n '/^NAME$/{n;p}' | grep -qE '^ +[a-z.-]+ - [a-z]' || fail "$m: NAME is not 'name - what'"
  echo "man -l $m: $(echo "$txt" | grep -cE '^[A-Z][A-Z ]+$') sections"
done
for p in dspark dspark-edge dspark-center; do
  dpkg-deb -f "$tmp"/pkgs/${p}_*.deb Depends | grep -qiE 'cuda|cublas' && fail "$p depends on CUDA"
done
dpkg-deb -f "$tmp"/pkgs/dspark-edge_*.deb Depends | grep -q libpaho-mqtt || fail "edge Depends lack libpaho-mqtt (shlibdeps)"
"$root/usr/bin/dspark-edge" --version || fail "installed dspark-edge does not run"
# The postinst against stubs: nothing touches this machine's users.
stub=$tmp/stub log=$tmp/calls
mkdir -p "$stub"
for c in addgroup adduser chown chgrp chmod mkdir systemctl deb-systemd-helper deb-systemd-invoke dpkg-maintscript-helper; do
  printf '#!/bin/sh\necho "%s $*" >> %s\n' "$c" "$log" > "$stub/$c"
done
printf '#!/bin/sh\ngrep -q "^$2:" %s/db 2>/dev/null\n' "$tmp" > "$stub/getent"
chmod +x "$stub"/*
PATH=$stub:/usr/bin:/bin sh "$tmp/ctl-dspark-edge/postinst" configure || fail "postinst"
cat "$log"
grep -q '^addgroup --system --quiet dspark' "$log" || fail "no system group"
grep -q '^adduser --system .*--home /var/lib/dspark .*dspark$' "$log" || fail "no system user"
grep -q '^chown dspark:dspark /var/lib/dspark' "$log" || fail "/var/lib/dspark not owned by dspark"
grep -q '^deb-systemd-helper enable dspark-edge.service' "$log" || fail "postinst does not enable the unit"
grep -v '^ *#' "$tmp/ctl-dspark-edge/postinst" | grep systemctl | grep -v daemon-reload | grep -q . && fail "postinst calls systemctl for more than daemon-reload"
printf 'dspark:x\n' > "$tmp/db"; : > "$log"
PATH=$stub:/usr/bin:/bin sh "$tmp/ctl-dspark-center/postinst" configure || fail "postinst (again)"
grep -q adduser "$log" && fail "postinst creates the user twice"
echo PASS

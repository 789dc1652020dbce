#!/usr/bin/env bash
# deploy.install — the .deb packages installed for real, with dpkg -i, into a
# scratch root: an overlay of this machine's / in a private mount namespace,
# entered with chroot, so dpkg sees the installed dependencies, the real
# maintainer scripts run (adduser, chown) and every write lands in a temp
# folder, never on this machine. Then: the dspark system user, /var/lib/dspark
# (dspark:dspark 0750), the configs readable by the group only, conffiles
# registered and kept over a reinstall, the programs run (the center finds
# the CUDA module where the build has one), remove keeps the conffiles and
# purge drops them.
# Skips (77) when it cannot make the scratch root: not root, no unshare, or
# no overlayfs. Usage: install.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
[ "$(id -u)" = 0 ] || { echo "not root: cannot mount the scratch root: skipped"; exit 77; }
for t in unshare chroot dpkg-deb cpack; do command -v $t >/dev/null || { echo "no $t: skipped"; exit 77; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{up,work,m}
if ! unshare -m --propagation private sh -c \
     "mount -t overlay overlay -o lowerdir=/,upperdir=$tmp/up,workdir=$tmp/work $tmp/m" 2>"$tmp/why"; then
  echo "cannot mount an overlay of / ($(cat "$tmp/why")): skipped"
  exit 77
fi
DS_LINTIAN=0 bash "$src/deploy/package.sh" "$build" "$tmp/pkgs" >/dev/null || { echo "FAIL: package.sh"; exit 1; }
ls "$tmp"/pkgs

# Everything below runs in the namespace, chrooted into the overlay.
cat >"$tmp/pkgs/check.sh" <<'EOF'
set -u
fail() { echo "FAIL: $*"; exit 1; }
cd /mnt
debs="dspark_*.deb dspark-edge_*.deb dspark-center_*.deb $(ls dspark-center-cuda_*.deb 2>/dev/null)"
getent passwd dspark >/dev/null && fail "this machine already has a dspark user: the check would prove nothing"
echo "== dpkg -i $debs"
dpkg -i $debs >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i"; }
for p in dspark dspark-edge dspark-center; do
  dpkg-query -W -f='${Status}\n' $p | grep -qx 'install ok installed' || fail "$p is not installed"
done
u=$(getent passwd dspark) || fail "no dspark user"
echo "user: $u"
uid=$(echo "$u" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "dspark is not a system user (uid $uid)"
echo "$u" | grep -q ':/var/lib/dspark:/usr/sbin/nologin$' || fail "dspark's home or shell"
getent group dspark >/dev/null || fail "no dspark group"
s=$(stat -c '%U:%G %a' /var/lib/dspark) || fail "no /var/lib/dspark"
echo "/var/lib/dspark: $s"
[ "$s" = "dspark:dspark 750" ] || fail "/var/lib/dspark is $s"
for f in /etc/dspark/edge.ini /etc/dspark/center.ini; do
  s=$(stat -c '%U:%G %a' $f)
  echo "$f: $s"
  [ "$s" = "root:dspark 640" ] || fail "$f is $s"
done
dpkg-query -W -f='${Conffiles}\n' dspark-edge | grep -q '/etc/dspark/edge.ini' || fail "edge.ini is not a conffile"
dspark --version >/dev/null || fail "dspark does not run"
dspark-edge --version || fail "dspark-edge does not run"
v=$(dspark-center --version) || fail "dspark-center does not run"
echo "$v"
if ls dspark-center-cuda_*.deb >/dev/null 2>&1; then
  echo "$v" | grep -q 'GPU module /usr/bin/../lib/[a-z0-9_-]*/dspark/dspark-cuda.so (cuda)' \
    || fail "the installed center does not load the installed CUDA module"
else
  echo "$v" | grep -q 'no GPU module' || fail "dspark-center --version without the module"
fi
# An operator's edit survives a reinstall; the user is not made twice.
echo "# edited by the operator" >>/etc/dspark/edge.ini
dpkg -i --force-confold $debs >dpkg2.log 2>&1 || { cat dpkg2.log; fail "dpkg -i again"; }
grep -q 'edited by the operator' /etc/dspark/edge.ini || fail "the reinstall lost the operator's edit"
[ "$(getent passwd dspark | cut -d: -f3)" = "$uid" ] || fail "the reinstall changed the user"
# remove keeps the conffiles, purge drops them.
dpkg -r dspark-edge >/dev/null 2>&1 || fail "dpkg -r dspark-edge"
[ ! -e /usr/bin/dspark-edge ] || fail "dspark-edge is still there after remove"
[ -e /etc/dspark/edge.ini ] || fail "remove dropped the conffile"
dpkg -P dspark-edge >/dev/null 2>&1 || fail "dpkg -P dspark-edge"
[ ! -e /etc/dspark/edge.ini ] || fail "purge kept the conffile"
[ -e /etc/dspark/center.ini ] || fail "purging the edge took the center's config"
echo PASS
EOF
unshare -m --propagation private bash -c "
  set -e
  mount -t overlay overlay -o lowerdir=/,upperdir=$tmp/up,workdir=$tmp/work $tmp/m
  mount --rbind /dev $tmp/m/dev
  mount -t proc proc $tmp/m/proc
  mount -t tmpfs tmpfs $tmp/m/tmp
  mount -t tmpfs tmpfs $tmp/m/run
  mount --bind $tmp/pkgs $tmp/m/mnt
  chroot $tmp/m env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh /mnt/check.sh"
rc=$?
# Nothing may have reached this machine.
getent passwd dspark >/dev/null && [ ! -e /usr/bin/dspark-edge ] && { echo "FAIL: the user leaked out of the scratch root"; exit 1; }
exit $rc

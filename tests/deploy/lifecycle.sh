#!/usr/bin/env bash
# deploy.lifecycle — the operator's first week, as the packages live it: the
# built .debs installed with dpkg into a scratch root (an overlay of this
# machine's / in private mount, network and PID namespaces, entered with chroot:
# every write lands in a temp folder, and the broker's port 1883 is the
# namespace's own), with Debian's mosquitto:
#   1. dspark-broker-config puts /etc/mosquitto/conf.d/dspark.conf where
#      Debian's mosquitto reads it; mosquitto starts on its stock
#      mosquitto.conf and loads it (no "Duplicate ... value");
#   2. dspark + dspark-edge, over an edge of the old layout (a snippet in
#      /etc/dspark/mosquitto, removed by the upgrade): the postinst enables dspark-edge.service
#      (deb-systemd-helper) and starts it (deb-systemd-invoke) as systemd
#      would for Type=notify: User=dspark, NOTIFY_SOCKET, READY=1 awaited
#      (tests/deploy/fake_systemctl.py stands in for systemctl: no systemd
#      runs here); the edge answers a dspark infer request;
#   3. an upgrade to a rebuilt package (the same .deb, version -2) restarts the
#      service: a new process, READY=1 again, a request answered again;
#   4. purge stops it and leaves nothing the packages made: every file dpkg -L
#      listed is gone, /etc/dspark, /var/lib/dspark and the unit's enablement
#      links and state too. What Debian practice keeps: the dspark system
#      user and group (a reused uid would own leftovers) and mosquitto's own
#      persistence file, which holds the retained messages of the session.
# Skips (77) when not root or without unshare/overlayfs/mosquitto.
# Usage: lifecycle.sh SOURCE_DIR BUILD_DIR MODELS_DIR
set -uo pipefail
src=$1 build=$2 models=$3
[ "$(id -u)" = 0 ] || { echo "not root: cannot mount the scratch root: skipped"; exit 77; }
for t in unshare chroot dpkg-deb cpack mosquitto python3 ip; do
  command -v $t >/dev/null || { echo "no $t: skipped"; exit 77; }
done
[ -r /etc/mosquitto/mosquitto.conf ] || { echo "no Debian mosquitto.conf: skipped"; exit 77; }
[ -r "$models/stories260K.gguf" ] || { echo "FAIL: no $models/stories260K.gguf"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{up,work,m}
if ! unshare -m -n --propagation private sh -c \
     "mount -t overlay overlay -o lowerdir=/,upperdir=$tmp/up,workdir=$tmp/work $tmp/m" 2>"$tmp/why"; then
  echo "cannot mount an overlay of / ($(cat "$tmp/why")): skipped"
  exit 77
fi
DS_LINTIAN=0 bash "$src/deploy/package.sh" "$build" "$tmp/pkgs" >/dev/null || { echo "FAIL: package.sh"; exit 1; }
# The rebuilt package of the upgrade: the same files, version -2.
deb=$(ls "$tmp"/pkgs/dspark-edge_*.deb)
dpkg-deb -R "$deb" "$tmp/re" || exit 1
v=$(dpkg-deb -f "$deb" Version)
sed -i "s/^Version: .*/Version: ${v%-*}-2/" "$tmp/re/DEBIAN/control"
mkdir -p "$tmp/pkgs/upgrade"
dpkg-deb --root-owner-group -b "$tmp/re" "$tmp/pkgs/upgrade/" >/dev/null
ls "$tmp"/pkgs/upgrade/*.deb >/dev/null || { echo "FAIL: rebuilding the edge package"; exit 1; }
# The layout before 0.1.0-1: version 0.1.0, a mosquitto snippet under
# /etc/dspark/mosquitto as a conffile, no maintainer scripts.
dpkg-deb -R "$deb" "$tmp/old" || exit 1
rm -f "$tmp"/old/DEBIAN/{preinst,postinst,prerm,postrm}
sed -i "s/^Version: .*/Version: ${v%-*}/" "$tmp/old/DEBIAN/control"
mkdir -p "$tmp/old/etc/dspark/mosquitto"
cp "$src/deploy/mosquitto/edge.conf" "$tmp/old/etc/dspark/mosquitto/dspark-edge.conf"
echo /etc/dspark/mosquitto/dspark-edge.conf >> "$tmp/old/DEBIAN/conffiles"
mkdir -p "$tmp/pkgs/old"
dpkg-deb --root-owner-group -b "$tmp/old" "$tmp/pkgs/old/" >/dev/null
mkdir -p "$tmp/pkgs/models"
cp "$models/stories260K.gguf" "$tmp/pkgs/models/"
cp "$src/tests/deploy/fake_systemctl.py" "$tmp/pkgs/"

cat >"$tmp/pkgs/check.sh" <<'IN'
set -u
fail() { echo "FAIL: $*"; for f in /run/fake-systemd/*.out /var/log/mosquitto/mosquitto.log; do [ -f $f ] && { echo "-- $f"; tail -15 $f; }; done; exit 1; }
cd /mnt
getent passwd dspark >/dev/null && fail "this machine already has a dspark user: the check would prove nothing"
ip link set lo up || fail "lo up"
# no systemd runs here: the stand-in systemctl, and /run/systemd/system so
# that the maintainer scripts act as they do on a systemd machine
install -m 0755 fake_systemctl.py /usr/local/sbin/systemctl
mkdir -p /run/systemd/system
rm -f /usr/sbin/policy-rc.d           # a container image's "start nothing" policy
rm -f /etc/mosquitto/conf.d/*.conf    # only what the package brings

echo "== 1. dspark-broker-config, then Debian's mosquitto on its stock mosquitto.conf"
dpkg -i dspark-broker-config_*.deb >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i dspark-broker-config"; }
[ -f /etc/mosquitto/conf.d/dspark.conf ] || fail "the drop-in is not in /etc/mosquitto/conf.d"
mkdir -p -m 740 /run/mosquitto /var/log/mosquitto
chown mosquitto /run/mosquitto /var/log/mosquitto
: > /var/log/mosquitto/mosquitto.log; chown mosquitto /var/log/mosquitto/mosquitto.log
mosquitto -c /etc/mosquitto/mosquitto.conf -d 2>mosq.err || { cat mosq.err; fail "mosquitto does not start with the drop-in"; }
for _ in $(seq 50); do grep -q 'Opening ipv4 listen socket on port 1883' /var/log/mosquitto/mosquitto.log && break; sleep 0.1; done
grep -q 'Loading config file /etc/mosquitto/conf.d/dspark.conf' mosq.err || { cat mosq.err; fail "mosquitto did not load the drop-in"; }
grep -q 'local only mode' /var/log/mosquitto/mosquitto.log && fail "mosquitto runs its default local-only listener, not the drop-in's"
grep -q 'Opening ipv4 listen socket on port 1883' /var/log/mosquitto/mosquitto.log || fail "no listener on 1883"
echo "mosquitto: $(cat mosq.err); listening on 127.0.0.1:1883"

echo "== 2. dspark and dspark-edge over the old layout: enabled and started as systemd would"
dpkg -i old/dspark-edge_*.deb >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i the old dspark-edge"; }
[ -f /etc/dspark/mosquitto/dspark-edge.conf ] || fail "the old package has no /etc/dspark/mosquitto snippet"
mkdir -p /var/lib/dspark/models
cp models/stories260K.gguf /var/lib/dspark/models/
dpkg -i dspark_*.deb dspark-edge_*.deb >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i dspark dspark-edge"; }
[ -e /etc/dspark/mosquitto ] && { ls -la /etc/dspark/mosquitto; cat dpkg.log; fail "the upgrade from the old layout left /etc/dspark/mosquitto"; }
echo "the old layout's /etc/dspark/mosquitto removed by the upgrade"
ls /etc/systemd/system/multi-user.target.wants/dspark-edge.service >/dev/null 2>&1 || { cat dpkg.log; fail "the postinst did not enable dspark-edge.service"; }
grep -q '^--quiet --system start dspark-edge.service$\|start dspark-edge.service' /run/fake-systemd/log || fail "the postinst did not start dspark-edge.service"
pid1=$(cat /run/fake-systemd/dspark-edge.service.pid)
grep -qx "$pid1" /run/fake-systemd/dspark-edge.service.ready || fail "no READY=1 from the edge"
[ "$(stat -c %U /proc/$pid1)" = dspark ] || fail "the edge does not run as dspark"
echo "dspark-edge: enabled, pid $pid1 as dspark, READY=1"
out=$(dspark infer -b tcp://127.0.0.1:1883 -m stories -p "Once upon a time" -n 8 --timeout-ms 20000 2>&1) \
  || { echo "$out"; fail "dspark infer against the installed edge"; }
echo "infer: $(echo "$out" | head -c 200)"

echo "== 3. upgrade to a rebuilt dspark-edge: the service restarts"
: > /run/fake-systemd/log
dpkg -i upgrade/dspark-edge_*.deb >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i the upgrade"; }
dpkg-query -W -f='${Version}\n' dspark-edge | grep -q -- '-2$' || fail "the upgrade is not installed"
grep -q 'restart dspark-edge.service' /run/fake-systemd/log || { cat /run/fake-systemd/log; fail "the upgrade did not restart the service"; }
pid2=$(cat /run/fake-systemd/dspark-edge.service.pid)
[ "$pid2" != "$pid1" ] || fail "the same process after the upgrade"
kill -0 "$pid1" 2>/dev/null && fail "the old edge still runs after the upgrade"
grep -qx "$pid2" /run/fake-systemd/dspark-edge.service.ready || fail "no READY=1 from the restarted edge"
dspark infer -b tcp://127.0.0.1:1883 -m stories -p "Hello" -n 4 --timeout-ms 20000 >/dev/null 2>&1 \
  || fail "dspark infer after the upgrade"
echo "dspark-edge: restarted (pid $pid1 -> $pid2), READY=1, answers"

echo "== 4. purge: nothing the packages made is left"
for p in dspark-edge dspark dspark-broker-config; do dpkg -L $p; done | sort -u > listed
dpkg-query -W -f='${Conffiles}\n' dspark-edge dspark-broker-config | awk 'NF {print $1}' >> listed
: > /run/fake-systemd/log
dpkg -P dspark-edge dspark dspark-broker-config >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -P"; }
grep -q 'stop dspark-edge.service' /run/fake-systemd/log || fail "remove did not stop the service"
kill -0 "$pid2" 2>/dev/null && fail "the edge still runs after purge"
left=""
while read -r f; do
  if [ -d "$f" ]; then
    case $f in *dspark*) left+=" $f" ;; esac     # shared folders (/usr/share/doc) stay
  elif [ -e "$f" ] || [ -L "$f" ]; then
    left+=" $f"
  fi
done < listed
[ -z "$left" ] || fail "purge left:$left"
for f in /etc/dspark /var/lib/dspark /etc/mosquitto/conf.d/dspark.conf; do [ -e $f ] && fail "purge left $f"; done
find /etc/systemd /var/lib/systemd -name '*dspark*' | grep . && fail "purge left the unit's enablement"
getent passwd dspark >/dev/null && echo "kept (Debian practice): the dspark system user and group"
echo PASS
IN
# A PID namespace: whatever the check starts (mosquitto, the edge) ends with it.
unshare -m -n -p -f --propagation private bash -c "
  set -e
  mount -t overlay overlay -o lowerdir=/,upperdir=$tmp/up,workdir=$tmp/work $tmp/m
  mount --rbind /dev $tmp/m/dev
  mount -t proc proc $tmp/m/proc
  mount -t tmpfs tmpfs $tmp/m/tmp
  mount -t tmpfs tmpfs $tmp/m/run
  mount --bind $tmp/pkgs $tmp/m/mnt
  chroot $tmp/m env -i PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin bash /mnt/check.sh"
rc=$?
# Whatever the overlay's upper layer holds with dspark in its name after the
# purge, beside dpkg's own records and the scratch files: what purge left.
if [ $rc = 0 ]; then
  stray=$(cd "$tmp/up" && find . -name '*dspark*' | grep -vE '^\./(var/lib/dpkg|var/cache|var/log|mnt|tmp|run)(/|$)')
  [ -z "$stray" ] || { echo "FAIL: left after purge (overlay upper layer):"; echo "$stray"; rc=1; }
fi
getent passwd dspark >/dev/null && [ ! -e /usr/bin/dspark-edge ] && { echo "FAIL: the user leaked out of the scratch root"; exit 1; }
exit $rc

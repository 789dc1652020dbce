#!/usr/bin/env bash
# deploy.mosquitto_dropin — the shipped drop-in (deploy/mosquitto/conf.d/
# dspark.conf) beside Debian's own /etc/mosquitto/mosquitto.conf, as the
# dspark-broker-config package installs it. The stock main file is COPIED to a
# temp dir (its pid_file, persistence_location, log file and include_dir moved
# there, nothing else changed), the drop-in copied into its conf.d with the
# loopback listener on a free port; then:
#   1. mosquitto starts (no "Duplicate ... value"), a client on 127.0.0.1
#      publishes and another receives, and the listener binds loopback only;
#   2. the commented network listener, uncommented (lab PKI of
#      deploy/pki/mkpki.sh, a password file, an ACL of mkacl.sh), starts too:
#      a client without credentials is refused, with them it is let in, and
#      the ACL holds (a device cannot read another device's replies).
# Never touches /etc or port 1883. Skips (77) without Debian's mosquitto.conf
# or mosquitto. Usage: mosquitto_dropin.sh SOURCE_DIR
set -uo pipefail
src=$1
main=/etc/mosquitto/mosquitto.conf
for t in mosquitto mosquitto_pub mosquitto_sub mosquitto_passwd openssl; do
  command -v $t >/dev/null || { echo "no $t: skipped"; exit 77; }
done
[ -r $main ] || { echo "no Debian $main: skipped"; exit 77; }
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && tail -20 "$tmp/log"; exit 1; }
chmod 755 "$tmp"
# mosquitto started as root drops to the mosquitto user after reading its config.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The stock main file with its paths moved into $tmp.
mkdir -p "$tmp/conf.d" "$tmp/persist" "$tmp/run"
sed -e "s#^pid_file .*#pid_file $tmp/run/mosquitto.pid#" \
    -e "s#^persistence_location .*#persistence_location $tmp/persist/#" \
    -e "s#^log_dest file .*#log_dest file $tmp/log#" \
    -e "s#^include_dir .*#include_dir $tmp/conf.d#" $main > "$tmp/mosquitto.conf"
diff $main "$tmp/mosquitto.conf" | grep '^>' | sed 's/^/main file, moved: /'
for k in pid_file persistence_location include_dir; do
  grep -q "^$k $tmp" "$tmp/mosquitto.conf" || fail "the stock main file has no $k to move"
done
touch "$tmp/log"
id mosquitto >/dev/null 2>&1 && chown mosquitto "$tmp/persist" "$tmp/run" "$tmp/log"

start() {   # start: run the broker on $tmp/mosquitto.conf, wait for $1 port
  : > "$tmp/log"; [ -n "$pid" ] && kill $pid 2>/dev/null && wait $pid 2>/dev/null
  mosquitto -c "$tmp/mosquitto.conf" >"$tmp/out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    kill -0 $pid 2>/dev/null || { cat "$tmp/out"; pid=""; return 1; }
    grep -q "Opening ipv4 listen socket on port $1" "$tmp/log" && return 0
    sleep 0.1
  done
  cat "$tmp/out"; return 1
}

# 1. the drop-in as shipped (port moved off 1883)
port=$(free_port)
sed "s#^listener 1883 127.0.0.1\$#listener $port 127.0.0.1#" "$src/deploy/mosquitto/conf.d/dspark.conf" > "$tmp/conf.d/dspark.conf"
grep -q "^listener $port 127.0.0.1\$" "$tmp/conf.d/dspark.conf" || fail "the drop-in has no 'listener 1883 127.0.0.1'"
for k in pid_file persistence persistence_location log_dest include_dir user; do
  grep -q "^$k " "$tmp/conf.d/dspark.conf" && fail "the drop-in sets $k, which Debian's main file owns"
done
start $port || fail "mosquitto did not start with the drop-in"
mosquitto_sub -h 127.0.0.1 -p $port -t dspark/v1/status/+ -C 1 -W 5 >"$tmp/got" 2>&1 &
sub=$!
sleep 0.5
mosquitto_pub -h 127.0.0.1 -p $port -t dspark/v1/status/edge-1 -m online -q 1 -r || fail "publish on the loopback listener"
wait $sub || fail "subscriber on the loopback listener: $(cat "$tmp/got")"
[ "$(cat "$tmp/got")" = online ] || fail "received '$(cat "$tmp/got")'"
echo "1. stock main file + drop-in: started, loopback publish/subscribe ok"
grep -q "Opening ipv6 listen socket on port $port" "$tmp/log" && fail "the loopback listener also listens on IPv6"
if command -v ss >/dev/null; then
  ss -ltnH "sport = :$port" | awk '{print $4}' | grep -vx "127.0.0.1:$port" && fail "listener $port is bound beyond loopback"
fi

# 2. the commented network listener, uncommented with a lab PKI, password, ACL
bash -c "sh '$src/deploy/pki/mkpki.sh' '$tmp/pki' dev-1:device dev-2:device" >/dev/null || fail "mkpki.sh"
sh "$src/deploy/mosquitto/mkacl.sh" dev-1:device dev-2:device > "$tmp/dspark.acl" || fail "mkacl.sh"
printf 'pw1\n' > "$tmp/pw1"
mosquitto_passwd -c -b "$tmp/dspark.passwd" dev-1 pw1 2>/dev/null || fail "mosquitto_passwd"
mosquitto_passwd -b "$tmp/dspark.passwd" dev-2 pw2 2>/dev/null || fail "mosquitto_passwd"
id mosquitto >/dev/null 2>&1 && chown -R mosquitto "$tmp/pki" "$tmp/dspark.passwd" "$tmp/dspark.acl"
tport=$(free_port)
sed -e '/^# listener 8883$/,/^# acl_file/s/^# //' \
    -e "s#^listener 8883\$#listener $tport 127.0.0.1#" \
    -e "s#/etc/mosquitto/certs/#$tmp/pki/#" -e "s#/etc/mosquitto/dspark\\.#$tmp/dspark.#" \
    "$tmp/conf.d/dspark.conf" > "$tmp/d" && mv "$tmp/d" "$tmp/conf.d/dspark.conf"
grep -q "^listener $tport" "$tmp/conf.d/dspark.conf" || fail "no commented 'listener 8883' block to enable"
grep -q "^acl_file $tmp/dspark.acl" "$tmp/conf.d/dspark.conf" || fail "the network block has no acl_file"
start $tport || fail "mosquitto did not start with the network listener enabled"
tls=(-h 127.0.0.1 -p $tport --cafile "$tmp/pki/ca.crt")
out=$(mosquitto_pub "${tls[@]}" -t dspark/v1/infer/m -m x 2>&1) && fail "anonymous publish on the network listener was let in"
echo "2. no credentials: $out"
out=$(mosquitto_pub "${tls[@]}" -u dev-1 -P wrong -t dspark/v1/infer/m -m x 2>&1) && fail "a wrong password was let in"
echo "   wrong password: $out"
mosquitto_sub "${tls[@]}" -u dev-2 -P pw2 -t 'dspark/v1/reply/dev-1/#' -C 1 -W 2 -V mqttv5 >"$tmp/spy" 2>&1 &
spy=$!
mosquitto_sub "${tls[@]}" -u dev-1 -P pw1 -t 'dspark/v1/reply/dev-1/#' -C 1 -W 5 >"$tmp/got" 2>&1 &
sub=$!
sleep 0.5
mosquitto_pub -h 127.0.0.1 -p $port -t dspark/v1/reply/dev-1/r1 -m answer -q 1 || fail "publish a reply on loopback"
wait $sub || fail "dev-1 with its password over TLS: $(cat "$tmp/got")"
[ "$(cat "$tmp/got")" = answer ] || fail "dev-1 received '$(cat "$tmp/got")'"
wait $spy; grep -q answer "$tmp/spy" && fail "the ACL let dev-2 read dev-1's replies"
echo "   dev-1 with its password over TLS: let in, got its reply; dev-2 did not (ACL)"
echo PASS

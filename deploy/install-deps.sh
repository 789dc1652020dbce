#!/usr/bin/env bash
# install-deps.sh — install every Debian package dspark builds, tests or runs with.
#
# Idempotent: packages already present are skipped, and apt-get update runs only
# when something is missing. Run as root (or with sudo available).
#
#   --arm64   also what the arm64 tests need (tests/cross, run by
#             deploy/test.sh): the cross compiler, qemu-user, and the arm64
#             libraries the kernels' and the engine's tests link (cmocka,
#             OpenBLAS, utf8proc, inih; Debian multiarch: adds the arm64
#             architecture to dpkg)
set -euo pipefail

arm64=0
case "${1:-}" in
  --arm64) arm64=1 ;;
  "") ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "install-deps: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

pkgs=(
  build-essential cmake pkg-config git ca-certificates
  clang libclang-rt-dev                  # sanitizer builds (ASan/UBSan) and fuzzing
  libpaho-mqtt-dev                       # MQTT 5 client (MQTTAsync)
  mosquitto mosquitto-clients            # broker, and mosquitto_pub/sub for operators
  libsqlite3-dev sqlite3                 # model registry
  libopenblas-dev                        # FP32 sgemm
  libsodium-dev                          # signatures and encryption of model bundles
  libcjson-dev                           # JSON messages
  libinih-dev                            # INI config files
  libutf8proc-dev                        # Unicode categories for the BPE pre-tokenizers
  libssl-dev openssl                     # the MQTT wrapper's TLS diagnosis; deploy/pki/mkpki.sh
  libcmocka-dev                          # unit tests
  python3-jsonschema                     # shared.msg validates encoder output against schemas/; shared.grammar its outputs
  python3-paho-mqtt                      # integration.malformed: a third-party MQTT 5 / 3.1.1 client
  libmicrohttpd-dev                      # the nodes' [http] API (TLS through GnuTLS); dspark exporter / dspark dashboard (HTTP)
  libgnutls28-dev                        # bench_http --tls: its HTTPS client (a dependency of libmicrohttpd-dev too)
  libncurses-dev                         # terminal handling headers (dspark top draws with plain ANSI)
  tmux                                   # integration.top drives dspark top in a pane
  prometheus                             # integration.exporter, integration.http: promtool check metrics
  chromium                               # integration.dashboard: the page in headless Chromium
  curl                                   # integration.exporter, integration.http fetch /metrics
  dpkg-dev fakeroot adduser              # deploy/package.sh: cpack -G DEB, dpkg-shlibdeps; postinst
  file binutils                          # deploy/package.sh: CPack's -dbgsym split (file, objcopy, readelf)
  lintian                                # deploy/package.sh (deploy.packages): 0 errors on every .deb
  man-db                                 # deploy.packages: man -l renders each page
  zsh                                    # deploy.completion: zsh -n on the zsh completion
  iproute2                               # deploy.lifecycle: lo up in its network namespace
  systemd                                # deploy.units: systemd-analyze verify / security --offline
  stress-ng                              # loading the CPUs by hand next to bench_busy (optional)
)

# Node.js and npm (puppeteer-core for integration.dashboard, the mqtt.js
# refresh of deploy/dashboard): Debian's, unless the machine already has a
# node and an npm (an image's own Node.js would conflict with Debian's npm).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then pkgs+=(nodejs npm); fi

if [ $arm64 = 1 ]; then
  # libc6-dev-arm64-cross: the C runtime (crt1.o, crti.o) and headers the
  # cross linker needs; only a Recommends of the compiler, which
  # --no-install-recommends leaves out
  pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libcmocka-dev:arm64
         libopenblas-dev:arm64 libutf8proc-dev:arm64 libinih-dev:arm64)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if [ $arm64 = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get -o DPkg::Lock::Timeout=900 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}"
# The Debian mosquitto package enables a system broker on port 1883; dspark's
# demo and tests start their own brokers on free ports and need nothing from it.
echo "install-deps: done"

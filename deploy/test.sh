#!/usr/bin/env bash
# test.sh — set up and run every test: installs the Debian packages dspark
# needs, builds twice (Release with -Werror; clang Debug with ASan+UBSan) and
# runs the whole ctest suite on both, then builds the daemons with
# ThreadSanitizer and runs the integration tests that drive the node's
# threads (Paho callbacks, the engine loop, outages and reconnects, overflow
# to centers, version loads and hot swaps, the model fetcher, speculation
# across nodes) with any report failing the run. Exit status 0 only if
# everything passed.
#
# Then the kernels and the engine, cross-built for arm64 and run under
# qemu-user (tests/cross): the NEON variants against the scalar reference,
# and the NEON engine's logits on ../shared/models/formats.
#
# Environment: DS_TEST_JOBS (parallel build jobs, default: CPUs),
#              DS_SKIP_SANITIZERS=1 to skip the ASan/UBSan and TSan passes
#              (local use),
#              DS_SKIP_ARM64=1 to skip the arm64 stage (local use),
#              DS_SKIP_CHAOS=1 to leave out the chaos suite (ctest label chaos,
#              ~35 s Release, ~2.5 min ASan; tests/chaos/run.sh runs it full size),
#              DS_SKIP_CLUSTER=1 to leave out the 3-node ejabberd cluster suite
#              (ctest label cluster, Release pass only: ~6 min on 2 cores with cluster.failover; it
#              starts three Erlang VMs per test, which the sanitizers add nothing to).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DS_TEST_JOBS:-$(nproc)}

bash deploy/install-deps.sh

if [ ! -f ../shared/models/stories260K.bin ]; then
  echo "test.sh: ../shared/models (the test models) must sit beside the checkout" >&2
  exit 1
fi

# integration.dashboard drives Chromium with puppeteer-core (pinned in
# tests/dashboard/package-lock.json).
(cd tests/dashboard && npm ci --no-audit --no-fund)
# integration.http drives the node's HTTP API with the official openai client
# (pinned in tests/http/package-lock.json).
(cd tests/http && npm ci --no-audit --no-fund)

echo "== Release build (gcc, -Werror) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDS_FATAL_WARNINGS=ON >/dev/null
cmake --build build -j "$jobs"
skip=""
if [ "${DS_SKIP_CHAOS:-0}" = 1 ]; then skip="chaos"; fi
if [ "${DS_SKIP_CLUSTER:-0}" = 1 ]; then skip="${skip:+$skip|}cluster"; fi
# As in the ASan stage below: the CPU-bound tests one at a time, the
# integration and chaos suites two at a time, then the broker cluster alone.
rel_rc=0
ctest --test-dir build --output-on-failure -LE "integration|chaos|cluster${skip:+|$skip}" || rel_rc=1
ctest --test-dir build --output-on-failure -j 2 -L "integration|chaos" -LE "cluster${skip:+|$skip}" || rel_rc=1
if [ "${DS_SKIP_CLUSTER:-0}" != 1 ]; then
  ctest --test-dir build --output-on-failure -L cluster ${skip:+-LE "$skip"} || rel_rc=1
fi
[ "$rel_rc" = 0 ]

if [ "${DS_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== ASan + UBSan build (clang, Debug) =="
  # DS_FUZZ: the libFuzzer binaries are built too (about 30 s on 2 cores),
  # so that a target that stopped linking fails here; fuzz.replay builds
  # its own objects and would not notice.
  cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
        -DDS_SANITIZE_ADDRESS=ON -DDS_SANITIZE_UNDEFINED=ON -DDS_FATAL_WARNINGS=ON -DDS_FUZZ=ON >/dev/null
  cmake --build build-asan -j "$jobs"
  # Short forms (DS_TEST_SHORT=1, tests/README.md) and two passes: the
  # CPU-bound tests one at a time, then the integration and chaos suites,
  # which mostly wait on brokers, daemons and timeouts, two at a time.
  asan_rc=0
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 DS_TEST_SHORT=1
  ctest --test-dir build-asan --output-on-failure -LE "nosan|cluster|integration|chaos${skip:+|$skip}" || asan_rc=1
  ctest --test-dir build-asan --output-on-failure -j 2 -L "integration|chaos" -LE "nosan|cluster${skip:+|$skip}" || asan_rc=1
  unset ASAN_OPTIONS UBSAN_OPTIONS DS_TEST_SHORT
  [ "$asan_rc" = 0 ]

  # The integration suite under TSan (README "ThreadSanitizer"), one at a
  # time: two at a time (tried with other builds beside it), TSan's cost
  # made integration.dist and integration.rollout miss their 120 s waits. Every
  # process (tests, daemons, CLI) writes its reports to build-tsan/tsan/
  # (log_path, inherited by children) and stops at its first (halt_on_error,
  # exit 66), so a daemon's report fails the run even when its test does
  # not look at how it exited.
  echo "== ThreadSanitizer build (clang, Debug): the node's threads =="
  tsan_tests="integration\..*"
  t0=$(date +%s)
  cmake -S . -B build-tsan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
        -DDS_SANITIZE_THREAD=ON -DDS_FATAL_WARNINGS=ON >/dev/null
  cmake --build build-tsan -j "$jobs" --target dspark dspark-edge dspark-center test_integration_mqtt \
        test_integration_edge test_integration_cli_infer test_integration_acl test_integration_tls \
        test_integration_outage test_integration_notify test_integration_center test_integration_overflow test_integration_route \
        test_integration_rollout test_integration_dist test_integration_specnet test_integration_spec_node \
        test_integration_ops test_integration_httpd test_integration_flood test_integration_http test_integration_grammar \
        test_integration_site
  rm -rf build-tsan/tsan && mkdir -p build-tsan/tsan
  tsan_rc=0
  TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp halt_on_error=1 exitcode=66 second_deadlock_stack=1 log_path=$PWD/build-tsan/tsan/report" \
    ctest --test-dir build-tsan --output-on-failure -R "^${tsan_tests}\$" || tsan_rc=1
  echo "test.sh: TSan pass (build + tests) took $(( $(date +%s) - t0 )) s"
  if compgen -G "build-tsan/tsan/report.*" >/dev/null; then
    cat build-tsan/tsan/report.*
    echo "test.sh: ThreadSanitizer reported (above; build-tsan/tsan/)" >&2
    tsan_rc=1
  fi
  [ "$tsan_rc" = 0 ]
fi
if [ "${DS_SKIP_ARM64:-0}" != 1 ]; then
  echo "== arm64 kernels and engine (aarch64-linux-gnu-gcc, qemu-user) =="
  bash deploy/install-deps.sh --arm64
  cmake -S tests/cross -B build-arm64 -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" >/dev/null
  cmake --build build-arm64 -j "$jobs"
  # The short forms, as in the ASan stage: under qemu every case costs 30-40x.
  DS_TEST_SHORT=1 ctest --test-dir build-arm64 --output-on-failure -j "$jobs"
fi
echo "test.sh: all tests passed"

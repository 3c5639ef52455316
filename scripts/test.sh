#!/usr/bin/env bash
#
# mailroom's test command: ./scripts/test.sh [OPTIONS] [CARGO ARGS...]
#
# 1. installs what is missing (postgresql-15, rabbitmq-server) with apt;
# 2. starts a throwaway PostgreSQL 15 cluster and a private RabbitMQ node,
#    each on a free loopback port, in a temp dir (never the system services,
#    never the default ports), and waits until they really accept connections;
# 3. exports
#      MAILROOM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:<port>/postgres
#          (superuser, trust auth over TCP: tests CREATE DATABASE per test,
#           see crates/mailroom-testkit: fresh_postgres_db())
#      MAILROOM_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:<port>/%2f
#      MAILROOM_TEST_AMQPS_URL=amqps://guest:guest@localhost:<port>/%2f (the
#          same node's TLS listener), MAILROOM_TEST_TLS_DIR (its test CA and certificates)
#      MAILROOM_TEST_OPENAPI_PYTHON=<a Python with openapi-spec-validator>
#          (scripts/openapi-validator.sh: a venv cached under ~/.cache)
#      MAILROOM_TEST_CHROMIUM, MAILROOM_TEST_CHROMEDRIVER (Debian's chromium and
#          chromium-driver, installed when missing: mailroom-cli's dashboard
#          browser test)
# 4. builds every target once (`cargo build --workspace --all-targets
#    [ARGS]`: the test binaries and the binaries the later steps run), runs
#    `cargo nextest run --workspace --no-fail-fast [ARGS]`, then
#    `cargo test --workspace --doc [ARGS]` (both run even if the first fails),
#    then, side by side, scripts/openapi-check.sh (schemathesis against
#    the built `mailroom`) and the quick fault matrix on both stores as
#    two processes, each every other row (`mailroom-faults --quick
#    --store both --shard K/2`, debug build, each under a `timeout`;
#    crates/mailroom-faults/README.md; about 4-5 minutes for the three on
#    2 cores), each into a log printed when all are done; the matrix never
#    with a -p/--package scope nor with --no-faults; and the docs book
#    (scripts/docs.sh build, which installs mdBook when missing), never
#    with a -p/--package scope;
# 5. always stops both servers and removes the temp dir (EXIT/INT/TERM), and
#    exits non-zero if any test step failed.
#
# CARGO ARGS go to the three cargo commands; `-p/--package` replaces --workspace:
#   ./scripts/test.sh -p mailroom-sqlite
#   ./scripts/test.sh -p mailroom-core -p mailroom-testkit --release
# nextest-only settings go through nextest's own env vars, e.g.
#   NEXTEST_NO_TESTS=warn ./scripts/test.sh -p some-crate-without-tests
#   NEXTEST_TEST_THREADS=1 ./scripts/test.sh
#
# OPTIONS
#   --prepare         install what the run needs (packages, the Python venvs,
#                     chromium, mdBook, cargo-nextest) and exit: .ci/run
#                     does it in the background while it compiles.
#   --services-only   start the services, print the `export` lines, and wait
#                     until Ctrl-C (then tear down). For development:
#                     run it in one terminal, paste the exports in another,
#                     and use cargo nextest / cargo test directly.
#   --no-doc          skip the doctest step.
#   --no-faults       skip the quick fault matrix (run by default, so in
#                     CI too).
#   --faults          run it (the default; kept for old command lines).
#   -h, --help        this text.
# For detached services see scripts/services.sh (up | env | down | status).
#
# Environment: MR_START_TIMEOUT (seconds per server, default 90),
# MR_FAULTS_TIMEOUT (seconds for each shard of the fault matrix, default 900),
# CARGO_TARGET_DIR and the usual cargo/nextest variables are honoured.
# Needs root or sudo only to apt-install missing packages; as root the
# servers run as the `postgres` and `rabbitmq` users.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
# shellcheck source=scripts/lib/services.sh
source "$REPO_ROOT/scripts/lib/services.sh"

services_only=false
prepare_only=false
run_doc=true
run_faults=true
faults_timeout="${MR_FAULTS_TIMEOUT:-900}"
cargo_args=()
while (($#)); do
  case "$1" in
    --services-only) services_only=true ;;
    --prepare) prepare_only=true ;;
    --no-doc) run_doc=false ;;
    --no-faults) run_faults=false ;;
    --faults) run_faults=true ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) cargo_args+=("$1") ;;
  esac
  shift
done

scope=(--workspace)
for a in "${cargo_args[@]+"${cargo_args[@]}"}"; do
  case "$a" in -p | --package | -p* | --package=*) scope=() ;; esac
done

T0="$(mr_now)"
section() { printf '\n==== %s  [+%s]\n' "$*" "$(mr_since "$T0")" >&2; }

# The checks that run side by side after the tests (below): their pids,
# start times and order; stopped (SIGTERM, then waited for) on the way out.
declare -A check_pid=() check_t0=()
check_order=()
check_kill() {
  local name
  for name in "${!check_pid[@]}"; do kill -TERM "${check_pid[$name]}" 2>/dev/null || true; done
  for name in "${!check_pid[@]}"; do wait "${check_pid[$name]}" 2>/dev/null || true; done
}

STATE=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$STATE" ]]; then
    section "teardown"
    check_kill
    mr_services_down "$STATE" || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if $prepare_only; then
  # What the steps below install when it is missing, installed now; each
  # step still checks for itself.
  section "prepare: packages"
  mr_ensure_packages
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    mr_apt_install chromium chromium-driver
  fi
  section "prepare: openapi-spec-validator and schemathesis venvs"
  mr_log "validator: $("$REPO_ROOT/scripts/openapi-validator.sh")"
  "$REPO_ROOT/scripts/openapi-check.sh" --install
  section "prepare: mdBook"
  "$REPO_ROOT/scripts/docs.sh" install
  if ! command -v cargo-nextest >/dev/null 2>&1; then
    section "prepare: cargo-nextest"
    cargo install --locked cargo-nextest
  fi
  section "prepared"
  exit 0
fi

section "services: PostgreSQL 15 + RabbitMQ"
STATE="$(mktemp -d "$(mr_tmp_base)/mailroom-test.XXXXXX")"
t="$(mr_now)"
mr_services_up "$STATE"
# Every MAILROOM_TEST_* variable the tests read (servers, certificates).
# shellcheck source=/dev/null
source "$STATE/env"
mr_log "services ready in $(mr_since "$t")"
cat "$STATE/env" >&2

if $services_only; then
  trap 'exit 0' INT TERM   # stopping is the normal way out here
  section "services running: paste the exports above in another shell; Ctrl-C to stop"
  # Background sleep + wait so INT/TERM reach the trap at once.
  while :; do sleep 3600 & wait $!; done
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  section "installing cargo-nextest (not found)"
  cargo install --locked cargo-nextest
fi

section "openapi-spec-validator (cached venv, for mailroom-server's openapi test)"
MAILROOM_TEST_OPENAPI_PYTHON="$("$REPO_ROOT/scripts/openapi-validator.sh")"
export MAILROOM_TEST_OPENAPI_PYTHON
mr_log "validator: $MAILROOM_TEST_OPENAPI_PYTHON"

section "chromium + chromedriver (for mailroom-cli's dashboard browser test)"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  mr_apt_install chromium chromium-driver
fi
MAILROOM_TEST_CHROMIUM="$(command -v chromium)" || mr_die "chromium not found after install"
MAILROOM_TEST_CHROMEDRIVER="$(command -v chromedriver)" || mr_die "chromedriver not found after install"
export MAILROOM_TEST_CHROMIUM MAILROOM_TEST_CHROMEDRIVER
mr_log "browser: $MAILROOM_TEST_CHROMIUM, driver: $MAILROOM_TEST_CHROMEDRIVER"

rc=0
# One build serves every step below: `--all-targets` builds what nextest
# builds (the same targets, so the same dependency features and profile)
# plus every binary, and the OpenAPI check and the fault matrix run those
# binaries. A `cargo build -p <one package>` resolves features for that
# package alone and recompiles much of the dependency graph.
build_cmd=(cargo build "${scope[@]}" --all-targets "${cargo_args[@]+"${cargo_args[@]}"}")
# One test slot more than there are cores: many tests mostly wait (a
# frozen network's timeout, a broker's heartbeat, a due time); the load
# tests take every slot (.config/nextest.toml).
export NEXTEST_TEST_THREADS="${NEXTEST_TEST_THREADS:-$(($(nproc) + 1))}"
nextest_cmd=(cargo nextest run "${scope[@]}" --no-fail-fast "${cargo_args[@]+"${cargo_args[@]}"}")
doc_cmd=(cargo test "${scope[@]}" --doc "${cargo_args[@]+"${cargo_args[@]}"}")
section "${build_cmd[*]}"
t="$(mr_now)"
build_rc=0
"${build_cmd[@]}" || build_rc=$?
mr_log "build finished (exit $build_rc) in $(mr_since "$t")"
rc=$build_rc
# Where that build put its binaries (the OpenAPI check and the fault matrix).
target_dir="$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
profile_dir=debug
for ((i = 0; i < ${#cargo_args[@]}; i++)); do
  case "${cargo_args[i]}" in
    -r | --release) profile_dir=release ;;
    --profile) profile_dir="${cargo_args[i + 1]:-dev}" ;;
    --profile=*) profile_dir="${cargo_args[i]#--profile=}" ;;
  esac
done
[[ $profile_dir != dev ]] || profile_dir=debug
bin_dir="$target_dir/$profile_dir"

section "${nextest_cmd[*]}"
t="$(mr_now)"
"${nextest_cmd[@]}" || rc=$?
mr_log "nextest finished (exit $rc) in $(mr_since "$t")"

if $run_doc; then
  section "${doc_cmd[*]}"
  t="$(mr_now)"
  doc_rc=0
  "${doc_cmd[@]}" || doc_rc=$?
  mr_log "doctests finished (exit $doc_rc) in $(mr_since "$t")"
  ((rc != 0)) || rc=$doc_rc
fi

# After the tests, the checks of the built binaries run at once, each into
# its own log (printed in order when all are done): schemathesis against a
# running `mailroom serve` (time-bounded passes), and the fault matrix on
# both stores as two processes, each every other row (--shard). Every
# scenario runs on servers of its own (a private RabbitMQ or PostgreSQL
# where it stops one), so the shards share nothing but the CPU; most rows
# wait on timeouts, outages, broker restarts and drains, which is why
# running them side by side takes a fraction of one after the other.
check_start() { # name command...
  local name="$1"
  shift
  check_order+=("$name")
  check_t0[$name]="$(mr_now)"
  "$@" >"$STATE/check-$name.log" 2>&1 &
  check_pid[$name]=$!
}

# schemathesis against a running `mailroom serve` and its /openapi.json.
# Not after a failed build: the binary there would be an older one.
((${#scope[@]} == 0 || build_rc != 0)) || {
  section "scripts/openapi-check.sh (started)"
  check_start openapi env MAILROOM_BIN="$bin_dir/mailroom" "$REPO_ROOT/scripts/openapi-check.sh"
}

# The fault matrix attacks the real binary (kill -9, a full disk, hung and
# poisoned handlers, duplicate storms, SIGTERM, a three-instance cluster) and
# fails if anything acknowledged is lost or processed twice at once.
if $run_faults && ((${#scope[@]})) && ((build_rc == 0)); then
  # `hostile` holds 2 x 200 slow connections + 1,024 open files (quick):
  # raise a low soft limit (often 1,024) where the hard one allows.
  soft="$(ulimit -Sn)" hard="$(ulimit -Hn)"
  if [[ $soft != unlimited ]] && ((soft < 4096)) && [[ $hard == unlimited || $hard -ge 4096 ]]; then
    ulimit -Sn 4096
  fi
  # Every wait inside the matrix is bounded and a scenario past its
  # deadline is a failed row; the timeout is the last guard. On SIGTERM the
  # matrix stops its scenario (children, private servers) and prints the
  # rows so far; KILL a minute later if even that hangs.
  for shard in 1/2 2/2; do
    section "fault matrix: mailroom-faults --quick --store both --shard $shard (started)"
    check_start "faults-${shard%/*}" env MAILROOM_BIN="$bin_dir/mailroom" \
      timeout --kill-after=60 "$faults_timeout" "$bin_dir/mailroom-faults" \
      --quick --store both --shard "$shard" --postgres-url "$MAILROOM_TEST_POSTGRES_URL"
  done
elif $run_faults && ((${#scope[@]})); then
  mr_log "fault matrix: not run, the build failed"
fi

# The docs book builds (a missing page fails it); its TOML blocks, command
# lines and links are checked by mailroom-cli's docs test above.
if ((${#scope[@]})); then
  section "docs book: scripts/docs.sh build"
  t="$(mr_now)"
  docs_rc=0
  "$REPO_ROOT/scripts/docs.sh" build || docs_rc=$?
  mr_log "docs book finished (exit $docs_rc) in $(mr_since "$t")"
  ((rc != 0)) || rc=$docs_rc
fi

for name in "${check_order[@]+"${check_order[@]}"}"; do
  check_rc=0
  wait "${check_pid[$name]}" || check_rc=$?
  section "$name: its output"
  cat "$STATE/check-$name.log" >&2
  ((check_rc != 124)) || mr_log "$name: timed out after ${faults_timeout}s"
  mr_log "$name finished (exit $check_rc) in $(mr_since "${check_t0[$name]}")"
  ((rc != 0)) || rc=$check_rc
  unset "check_pid[$name]"
done

mr_log "disk: $(df -h --output=avail . | tail -n1 | tr -d ' ') free where the build is"
if ((rc == 0)); then section "tests passed"; else section "tests FAILED (exit $rc)"; fi
exit "$rc"

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
#    then the quick fault matrix on both stores (`mailroom-faults
#    --quick`, debug build, about 4-5 minutes on 2 loaded cores, under a
#    `timeout`; crates/mailroom-faults/README.md); never with a -p/--package
#    scope, nor with --no-faults; and the docs book (scripts/docs.sh build,
#    which installs mdBook when missing), never with a -p/--package scope;
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
# MR_FAULTS_TIMEOUT (seconds for the whole fault matrix, default 900),
# CARGO_TARGET_DIR and the usual cargo/nextest variables are honoured.
# Needs root or sudo only to apt-install missing packages; as root the
# servers run as the `postgres` and `rabbitmq` users.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
# shellcheck source=scripts/lib/services.sh
source "$REPO_ROOT/scripts/lib/services.sh"

services_only=false
run_doc=true
run_faults=true
faults_timeout="${MR_FAULTS_TIMEOUT:-900}"
cargo_args=()
while (($#)); do
  case "$1" in
    --services-only) services_only=true ;;
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

STATE=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$STATE" ]]; then
    section "teardown"
    mr_services_down "$STATE" || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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

# schemathesis against a running `mailroom serve` and its /openapi.json.
# Not after a failed build: the binary there would be an older one.
((${#scope[@]} == 0 || build_rc != 0)) || {
  section "scripts/openapi-check.sh"
  MAILROOM_BIN="$bin_dir/mailroom" "$REPO_ROOT/scripts/openapi-check.sh" || { r=$?; ((rc != 0)) || rc=$r; }
}

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

# The fault matrix attacks the real binary (kill -9, a full disk, hung and
# poisoned handlers, duplicate storms, SIGTERM, a three-instance cluster) and
# fails if anything acknowledged is lost or processed twice at once.
if $run_faults && ((${#scope[@]})); then
  section "fault matrix: mailroom-faults --quick --store both"
  t="$(mr_now)"
  # The binaries of the build above.
  faults_rc=$build_rc
  # `hostile` holds 2 x 200 slow connections + 1,024 open files (quick):
  # raise a low soft limit (often 1,024) where the hard one allows.
  soft="$(ulimit -Sn)" hard="$(ulimit -Hn)"
  if [[ $soft != unlimited ]] && ((soft < 4096)) && [[ $hard == unlimited || $hard -ge 4096 ]]; then
    ulimit -Sn 4096
  fi
  if ((faults_rc == 0)); then
    # Every wait inside the matrix is bounded and a scenario past its
    # deadline is a failed row; this is the last guard. On SIGTERM the
    # matrix stops its scenario (children, private servers) and prints the
    # rows so far; KILL a minute later if even that hangs.
    MAILROOM_BIN="$bin_dir/mailroom" timeout --kill-after=60 "$faults_timeout" \
      "$bin_dir/mailroom-faults" \
      --quick --store both --postgres-url "$MAILROOM_TEST_POSTGRES_URL" || faults_rc=$?
    ((faults_rc != 124)) || mr_log "fault matrix: timed out after ${faults_timeout}s"
  fi
  mr_log "fault matrix finished (exit $faults_rc) in $(mr_since "$t")"
  ((rc != 0)) || rc=$faults_rc
fi

mr_log "disk: $(df -h --output=avail . | tail -n1 | tr -d ' ') free where the build is"
if ((rc == 0)); then section "tests passed"; else section "tests FAILED (exit $rc)"; fi
exit "$rc"

#!/usr/bin/env bash
#
# Checks a running `mailroom serve` against its own /openapi.json with
# schemathesis: ./scripts/openapi-check.sh [--keep | --install]
#
# 1. installs schemathesis (pinned below) into a cached venv,
#    ${XDG_CACHE_HOME:-~/.cache}/mailroom/schemathesis-<version> (python3-venv
#    is apt-installed when missing);
# 2. builds the `mailroom` binary (debug, CARGO_TARGET_DIR honoured) unless
#    MAILROOM_BIN names one;
# 3. starts it twice on free loopback ports, with SQLite in a temp dir and a
#    config that declares a source and a topic of each kind (unsigned and
#    token-verified sources; single, sequential and batch topics with a
#    command handler, a pull topic): once without `api_token`, once with one
#    and `protect_metrics`, where every request carries the bearer token;
#    each gets a few events through both doors first, so every route finds
#    something to work on;
# 4. runs `st run --checks all` against each, every phase, a bounded number
#    of examples per operation (MR_OPENAPI_EXAMPLES, default 40) and a time
#    budget per pass (MR_OPENAPI_MAX_TIME seconds, default 60; the two
#    ignored_auth passes a third of it);
# 5. exits non-zero when schemathesis reports any failure or error; the
#    servers' logs are printed then. --keep leaves the temp dir (logs,
#    reports) in place. --install does step 1 only (scripts/test.sh
#    --prepare).
#
# scripts/test.sh runs it after the tests.
set -euo pipefail

VERSION="4.32.5"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/services.sh
source "$REPO_ROOT/scripts/lib/services.sh"

keep=false
install_only=false
case "${1:-}" in
  --keep) keep=true ;;
  --install) install_only=true ;;
  "") ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  *) mr_die "unknown argument: $1 (see --help)" ;;
esac
examples="${MR_OPENAPI_EXAMPLES:-40}"
max_time="${MR_OPENAPI_MAX_TIME:-60}"

# --- schemathesis, in a venv of its own ---------------------------------------
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  mr_apt_install python3 python3-venv
fi
venv="${XDG_CACHE_HOME:-$HOME/.cache}/mailroom/schemathesis-$VERSION"
st="$venv/bin/st"
if [[ ! -x "$st" || ! -e "$venv/.installed" ]]; then
  mr_log "installing schemathesis $VERSION into $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "schemathesis==$VERSION" >&2
  touch "$venv/.installed"
fi
$install_only && { mr_log "schemathesis $VERSION: $venv"; exit 0; }

# --- the binary ----------------------------------------------------------------
bin="${MAILROOM_BIN:-}"
if [[ -z "$bin" ]]; then
  (cd "$REPO_ROOT" && cargo build -p mailroom-cli) >&2
  target_dir="$(cd "$REPO_ROOT" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
  bin="$target_dir/debug/mailroom"
fi
[[ -x "$bin" ]] || mr_die "no mailroom binary at $bin"

dir="$(mktemp -d "$(mr_tmp_base)/mailroom-openapi.XXXXXX")"
pids=()
cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${pids[@]+"${pids[@]}"}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if $keep; then mr_log "kept $dir"; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A config with something for every route: `name` is the instance, `token`
# its api_token (empty: none).
write_config() {
  local name="$1" port="$2" token="$3"
  mkdir -p "$dir/$name"
  {
    echo "listen = \"127.0.0.1:$port\""
    if [[ -n "$token" ]]; then
      echo "api_token = \"$token\""
      echo "protect_metrics = true"
    fi
    cat <<EOF
[store]
url = "sqlite://$dir/$name/mailroom.db"

# Any body: the dedup key is the default chain's (webhook-id,
# Idempotency-Key, /id of a JSON body, else the body's SHA-256).
[[source]]
name = "orders"
topic = "orders"

[[source]]
name = "payments"
topic = "payments"
key = { json = "/customer" }
verify = { scheme = "token", header = "x-token", secret = "payments-secret" }

[[topic]]
name = "orders"
handler = { command = ["true"] }

# The webhooks' key comes from the source; API events must name theirs.
[[topic]]
name = "payments"
mode = "sequential"
handler = { command = ["false"] }
retry = { max_attempts = 2, base = "100ms" }

[[topic]]
name = "reports"
mode = "batch"
batch = { max_size = 10, max_wait = "1s" }
handler = { command = ["true"] }

[[topic]]
name = "jobs"
EOF
  } >"$dir/$name/mailroom.toml"
}

# Starts instance `name` and waits until /readyz answers 200.
start() {
  local name="$1" port="$2" i
  "$bin" --config "$dir/$name/mailroom.toml" serve >>"$dir/$name/serve.log" 2>&1 &
  pids+=($!)
  for ((i = 0; i < 300; i++)); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null; then return 0; fi
    kill -0 "${pids[-1]}" 2>/dev/null || { mr_tail "$dir/$name/serve.log"; mr_die "mailroom ($name) exited at start"; }
    sleep 0.2
  done
  mr_tail "$dir/$name/serve.log"
  mr_die "mailroom ($name) did not answer on :$port within 60 s"
}

# A few events through both doors, so lists, reads, replays and claims have
# something to work on.
seed() {
  local port="$1" token="$2" i auth=()
  [[ -z "$token" ]] || auth=(-H "authorization: Bearer $token")
  for ((i = 0; i < 3; i++)); do
    curl -fsS -o /dev/null -H 'content-type: application/json' \
      -d "{\"id\": \"o-$i\", \"type\": \"created\"}" "http://127.0.0.1:$port/webhooks/orders"
    curl -fsS -o /dev/null -H 'content-type: application/json' -H 'x-token: payments-secret' \
      -d "{\"id\": \"p-$i\", \"customer\": \"c-$i\"}" "http://127.0.0.1:$port/webhooks/payments"
    for topic in jobs reports; do
      curl -fsS -o /dev/null "${auth[@]+"${auth[@]}"}" -H 'content-type: application/json' \
        -H "idempotency-key: $topic-$i" -d "{\"topic\": \"$topic\", \"payload\": {\"n\": $i}}" \
        "http://127.0.0.1:$port/v1/events"
    done
  done
}

# What schemathesis is told besides the document: a repeat of an
# Idempotency-Key with another body is refused with 422 (the IETF draft's
# answer), whatever the body, so a valid request may meet it.
cat >"$dir/schemathesis.toml" <<'EOF'
[[operations]]
include-path = "/v1/events"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
EOF

# `st`, with the module its workers import lazily on their first request
# (schemathesis.transport.asgi, which imports anyio) imported first: two
# worker threads compiling anyio's source at once can fail with CPython
# 3.11's "SystemError: AST constructor recursion depth mismatch", an error
# of the runner that fails the check (seen with the machine loaded).
st_main() {
  "$venv/bin/python" -c 'import sys
import schemathesis.transport.asgi
from schemathesis.cli import schemathesis
sys.argv[0] = "st"
sys.exit(schemathesis())' "$@"
}

# Runs schemathesis against instance `name`; extra arguments go to `st run`.
check() {
  local name="$1" port="$2"
  shift 2
  mr_log "schemathesis $VERSION against $name (:$port): --checks all, $examples examples per operation, at most ${max_time}s $*"
  (cd "$dir/$name" && st_main --config-file "$dir/schemathesis.toml" run "http://127.0.0.1:$port/openapi.json" \
    --checks all --max-examples "$examples" --max-time "$max_time" \
    --workers 2 --seed 1 --no-color --generation-database none \
    --report junit --report-dir "$dir/$name/report" \
    --request-timeout 10 "$@")
}

token="openapi-check-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
open_port="$(mr_free_port)"
guarded_port="$(mr_free_port)"
write_config open "$open_port" ""
write_config guarded "$guarded_port" "$token"
start open "$open_port"
start guarded "$guarded_port"
guarded_pid="${pids[-1]}"
seed "$open_port" ""
seed "$guarded_port" "$token"

rc=0
check open "$open_port" || rc=$?
# With the token on every request. Wrong tokens are counted per client and
# the 11th within a minute gets 429 until it ends, so this pass sends none
# (no generated Authorization values) ...
check guarded "$guarded_port" -H "Authorization: Bearer $token" \
  --generation-with-security-parameters false --exclude-checks ignored_auth || rc=$?
# ... and ignored_auth (an operation answered 200 is asked again without a
# token and with a wrong one: 401 expected) runs on a fresh instance per
# group of at most 9 operations, so at most 9 wrong tokens each.
for group in '^/v1/events' '^/(v1/(cancel|replay|stats|topics)|metrics|readyz)'; do
  kill "$guarded_pid" 2>/dev/null || true
  wait "$guarded_pid" 2>/dev/null || true
  start guarded "$guarded_port"
  guarded_pid="${pids[-1]}"
  check guarded "$guarded_port" -H "Authorization: Bearer $token" \
    --generation-with-security-parameters false --checks ignored_auth \
    --include-path-regex "$group" --max-examples 5 --phases fuzzing \
    --max-time "$((max_time / 3 + 1))" || rc=$?
done
if ((rc != 0)); then
  mr_tail "$dir/open/serve.log" "$dir/guarded/serve.log"
  mr_log "schemathesis found failures (exit $rc): the document and the server disagree"
fi
exit "$rc"

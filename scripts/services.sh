#!/usr/bin/env bash
#
# Detached test services for development (the same throwaway PostgreSQL 15
# and private RabbitMQ node that ./scripts/test.sh starts for one run).
#
#   scripts/services.sh up      start them (installs missing packages) and
#                               print the `export` lines
#   scripts/services.sh env     print the `export` lines again:
#                                 eval "$(scripts/services.sh env)"
#                                 cargo nextest run -p mailroom-testkit
#   scripts/services.sh status  say whether they are up
#   scripts/services.sh down    stop them and delete their data
#
# State lives in $MAILROOM_SERVICES_DIR (default: /tmp/mailroom-services-$USER;
# $TMPDIR instead of /tmp when not root).
# `up` when already up just prints the exports; `down` when down is a no-op.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
# shellcheck source=scripts/lib/services.sh
source "$REPO_ROOT/scripts/lib/services.sh"

DIR="${MAILROOM_SERVICES_DIR:-$(mr_tmp_base)/mailroom-services-$(id -un)}"

is_up() {
  [[ -f "$DIR/env" && -f "$DIR/pg.port" && -f "$DIR/pgtls.port" && -f "$DIR/pgbouncer.port" \
    && -f "$DIR/amqp.port" ]] || return 1
  mr_pg_answers "$(cat "$DIR/pg.port")" "" || return 1
  mr_pg_answers "$(cat "$DIR/pgtls.port")" "sslmode=require" || return 1
  mr_pg_answers "$(cat "$DIR/pgbouncer.port")" "" || return 1
  mr_amqp_handshake "$(cat "$DIR/amqp.port")"
}

case "${1:-}" in
  up)
    if is_up; then
      mr_log "already up ($DIR)"
    else
      mr_services_down "$DIR"   # leftovers of a half-started or dead set
      failed=true
      trap '$failed && mr_services_down "$DIR"' EXIT
      mr_services_up "$DIR"
      failed=false
    fi
    cat "$DIR/env"
    ;;
  env)
    is_up || mr_die "services are not up: run scripts/services.sh up"
    cat "$DIR/env"
    ;;
  status)
    if is_up; then echo "up ($DIR)"; cat "$DIR/env"; else echo "down"; exit 1; fi
    ;;
  down)
    mr_services_down "$DIR"
    mr_log "down"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# PostgreSQL alone, without mailroom: how much faster do two pgbench
# clients drain a 100,000-event backlog than one, running mailroom's own
# claim and completion statements (cycle.sql)? The bound the two-instance
# drain ratio (`mailroom-bench pg`) is measured against on one machine.
#
# usage: ceiling.sh DATABASE_URL [ROUNDS]
#   DATABASE_URL: a scratch database, migrated by mailroom
#   (`mailroom migrate`); its mailroom tables are emptied and refilled.
set -euo pipefail
url=${1:?usage: ceiling.sh DATABASE_URL [ROUNDS]}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)
load="
TRUNCATE mailroom.events, mailroom.attempts;
INSERT INTO mailroom.events (id, source, topic, dedup_key, type, status, max_attempts,
                             next_attempt_at, content_type, payload)
SELECT u, 'api', 't', u::text, 'bench', 'pending', 15, now(), 'application/json',
       convert_to(repeat('x', 256), 'UTF8')
FROM (SELECT mailroom.uuid_v7() AS u, g FROM generate_series(1, 100000) g) s ORDER BY g;
VACUUM ANALYZE mailroom.events;
CHECKPOINT;"
for r in $(seq 1 "$rounds"); do
  declare -A rate=()
  for c in 1 2; do
    printf "%s\n" "$load" | psql -X -q -v ON_ERROR_STOP=1 "$url" -f - >/dev/null
    # 1,400 claims of 64 in all: about 90% of the backlog.
    tps=$("$pgbench" -n -M prepared -c "$c" -j "$c" -t $((1400 / c)) -f "$here/cycle.sql" "$url" 2>&1 \
          | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    rate[$c]=$(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 64 }')
  done
  awk -v r="$r" -v a="${rate[1]}" -v b="${rate[2]}" \
    'BEGIN { printf "round %d: 1 client %d events/s, 2 clients %d events/s, ratio %.2fx\n", r, a, b, b / a }'
done

#!/usr/bin/env bash
# PostgreSQL alone, without mailroom: how fast do 1, 2 and 4 pgbench clients
# drain a 100,000-event backlog, running mailroom's own claim and completion
# statements (cycle.sql)? The bound the two-instance drain ratio
# (`mailroom-bench pg`) is measured against on one machine.
#
# One mailroom instance keeps two connections committing at once (its claim
# loop and its completion group), two instances keep four; each pgbench
# client runs claim and completion one after the other. So "4 clients / 2
# clients" is PostgreSQL's own answer to what a second instance can add,
# and "2 clients / 1 client" what a second committing connection adds.
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
TRUNCATE mailroom.events, mailroom.attempts, mailroom.queue;
WITH inserted AS (
    INSERT INTO mailroom.events (id, source, topic, dedup_key, type, status, max_attempts,
                                 next_attempt_at, content_type, payload)
    SELECT u, 'api', 't', u::text, 'bench', 'pending', 15, now(), 'application/json',
           convert_to(repeat('x', 256), 'UTF8')
    FROM (SELECT mailroom.uuid_v7() AS u, g FROM generate_series(1, 100000) g) s ORDER BY g
    RETURNING seq, topic, key, next_attempt_at
)
INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
SELECT seq, topic, key, next_attempt_at, 'pending' FROM inserted;
VACUUM ANALYZE mailroom.events, mailroom.queue;
CHECKPOINT;"
ratios21=()
ratios42=()
for r in $(seq 1 "$rounds"); do
  declare -A rate=()
  for c in 1 2 4; do
    printf "%s\n" "$load" | psql -X -q -v ON_ERROR_STOP=1 "$url" -f - >/dev/null
    # 1,400 claims of 64 in all: about 90% of the backlog.
    tps=$("$pgbench" -n -M prepared -c "$c" -j "$c" -t $((1400 / c)) -f "$here/cycle.sql" "$url" 2>&1 \
          | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    [[ -n "$tps" ]] || { echo "pgbench failed with $c clients" >&2; exit 1; }
    rate[$c]=$(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 64 }')
  done
  ratios21+=("$(awk -v a="${rate[1]}" -v b="${rate[2]}" 'BEGIN { printf "%.2f", b / a }')")
  ratios42+=("$(awk -v b="${rate[2]}" -v d="${rate[4]}" 'BEGIN { printf "%.2f", d / b }')")
  printf "round %d: events/s with 1 client %d, 2 clients %d, 4 clients %d; 2/1 %sx, 4/2 %sx\n" \
    "$r" "${rate[1]}" "${rate[2]}" "${rate[4]}" "${ratios21[-1]}" "${ratios42[-1]}"
done
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median over $rounds rounds: 2/1 $(median "${ratios21[@]}")x, 4/2 $(median "${ratios42[@]}")x"

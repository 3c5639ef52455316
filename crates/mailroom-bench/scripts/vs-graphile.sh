#!/usr/bin/env bash
# mailroom against Graphile Worker on PostgreSQL, in one run on one server:
# alternating rounds of graphile.sh (graphile-worker 0.18, fast settings)
# and `mailroom-bench drain --modes single` (graphile first in odd rounds,
# mailroom first in even ones), the same number of no-op jobs/events each,
# then every round's rates, mailroom / graphile and its median (the
# target: >= 2x), and each side's database work per 1,000 events.
#
# usage: vs-graphile.sh [ROUNDS] [drain options...]
#   ROUNDS default 3; drain options are added after `--modes single`
# environment: STORE (default $MAILROOM_TEST_POSTGRES_URL), JOBS (default
#   100000), MAILROOM_BENCH (a built mailroom-bench; default: build this
#   checkout --release with $CARGO_TARGET_DIR), GRAPHILE_DIR (see graphile.sh),
#   FLOOR=1: each round also runs `mailroom-bench floor` (the raw SQL loop
#   doing only the durable writes a drained event needs on mailroom's
#   schema, beside the engine's batch drain) and prints floor / graphile:
#   no dispatcher keeping mailroom's durable record can beat the floor, so
#   it bounds the ratio any engine on this schema reaches on this machine.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
shift $(( $# >= 1 ? 1 : 0 ))
store=${STORE:-${MAILROOM_TEST_POSTGRES_URL:-}}
[[ -n $store ]] || { echo "vs-graphile.sh: set STORE or MAILROOM_TEST_POSTGRES_URL" >&2; exit 64; }
jobs=${JOBS:-100000}
bench=${MAILROOM_BENCH:-}
if [[ -z $bench ]]; then
    repo=$(git -C "$here" rev-parse --show-toplevel)
    (cd "$repo" && cargo build --quiet --release -p mailroom-bench)
    bench=${CARGO_TARGET_DIR:-$repo/target}/release/mailroom-bench
fi
work=$(mktemp -d /tmp/mailroom-vs-graphile.XXXXXX)
trap 'rm -rf "$work"' EXIT

for ((r = 1; r <= rounds; r++)); do
    order=(graphile mailroom)
    (( r % 2 == 0 )) && order=(mailroom graphile)
    [[ ${FLOOR:-0} == 1 ]] && order+=(floor)
    for side in "${order[@]}"; do
        echo "vs-graphile.sh: round $r/$rounds: $side (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        if [[ $side == graphile ]]; then
            "$here/graphile.sh" --store "$store" --jobs "$jobs" --json >"$work/graphile-$r.json"
        elif [[ $side == floor ]]; then
            RUST_LOG=${RUST_LOG:-error} "$bench" floor --store "$store" --events "$jobs" \
                --json >"$work/floor-$r.json"
        else
            RUST_LOG=${RUST_LOG:-error} "$bench" drain --store "$store" --modes single \
                --events "$jobs" --json "$@" >"$work/mailroom-$r.json"
        fi
    done
done

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys

work, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    with open(f"{work}/{name}.json") as f:
        return json.load(f)

def row(label, rate, db):
    db = db or {}
    get = lambda k, f: "-" if db.get(k) is None else f(db[k])
    return (f"{label:<10}{rate:>12,.0f}"
            f"{get('cpu_secs_per_1k', lambda v: f'{v:.3f}'):>13}"
            f"{get('wal_bytes_per_1k', lambda v: f'{v / 2**20:.2f}'):>12}"
            f"{get('wal_records_per_event', lambda v: f'{v:.1f}'):>9}"
            f"{get('events_per_cpu_sec', lambda v: f'{v:,.0f}'):>13}")

g0 = load("graphile-1")
print(f"mailroom single vs graphile-worker {g0['graphile_worker']} (Node {g0['node']}), "
      f"{g0['jobs']} no-op jobs each, {rounds} alternating rounds")
print(f"{'round':<6}{'side':<10}{'per s':>12}{'pg s/1k':>13}{'WAL MiB/1k':>12}{'rec/ev':>9}{'ev/pg CPU-s':>13}{'m/g':>8}")
ratios, cpu_ratios = [], []
for r in range(1, rounds + 1):
    g, m = load(f"graphile-{r}"), load(f"mailroom-{r}")["modes"][0]
    ratio = m["events_per_sec"] / g["jobs_per_sec"]
    ratios.append(ratio)
    if m.get("db") and g["db"]["cpu_secs_per_1k"]:
        cpu_ratios.append(m["db"]["cpu_secs_per_1k"] / g["db"]["cpu_secs_per_1k"])
    print(f"{r:<6}" + row("graphile", g["jobs_per_sec"], g["db"]))
    print(f"{r:<6}" + row("mailroom", m["events_per_sec"], m.get("db")) + f"{ratio:>7.2f}x")
print(f"median mailroom/graphile: {statistics.median(ratios):.2f}x (rounds: "
      + ", ".join(f"{x:.2f}x" for x in ratios) + "); target >= 2x")
if cpu_ratios:
    print(f"median PostgreSQL CPU per event, mailroom/graphile: {statistics.median(cpu_ratios):.2f}x")
try:
    floors = [load(f"floor-{r}") for r in range(1, rounds + 1)]
except FileNotFoundError:
    floors = []
if floors:
    print("floor rounds (after the round's graphile and mailroom sides): raw SQL floor, "
          "the engine's batch drain and its single drain again")
    print(f"{'round':<6}{'side':<10}{'per s':>12}{'pg s/1k':>13}{'WAL MiB/1k':>12}{'rec/ev':>9}{'ev/pg CPU-s':>13}{'x/g':>8}")
    by_side = {"floor": [], "batch": [], "single": []}
    for r, f in enumerate(floors, start=1):
        g, fr = load(f"graphile-{r}")["jobs_per_sec"], f["rounds"][0]
        for side, res in (("floor", fr["raw"]), ("batch", fr["batch"]), ("single", fr["single"])):
            by_side[side].append(res["events_per_sec"] / g)
            print(f"{r:<6}" + row(side, res["events_per_sec"], res.get("db"))
                  + f"{res['events_per_sec'] / g:>7.2f}x")
    print("median against graphile: " + ", ".join(
        f"{side} {statistics.median(v):.2f}x" for side, v in by_side.items())
        + " (the floor bounds what any engine on mailroom's schema reaches here)")
PY

#!/usr/bin/env bash
# Before/after on PostgreSQL, in one run on one server: builds BEFORE (a git
# commit) in a temporary worktree and this checkout, both release, then runs
# `mailroom-bench drain --json` of each in alternating rounds (before, after;
# after, before; ...) and prints every row, each round's after/before ratios
# and their medians: events/s, PostgreSQL CPU-seconds and WAL per 1,000
# events, WAL records per event.
#
# By default the BEFORE build gets this checkout's crates/mailroom-bench
# copied over its own, so both sides are measured by the same code and only
# the engine and stores differ (BENCH=own keeps BEFORE's bench, whose drain
# may not print the database work).
#
# usage: compare.sh BEFORE [ROUNDS] [drain options...]
#   BEFORE   a commit (e.g. main's commit before a change)
#   ROUNDS   alternating rounds (default 3)
#   drain options default to `--modes single`
# environment: STORE (default $MAILROOM_TEST_POSTGRES_URL), CARGO_TARGET_DIR,
#   BEFORE_TARGET_DIR (default: CARGO_TARGET_DIR/compare-before),
#   BENCH=current|own, KEEP=1 keeps the JSON files (their directory is printed),
#   BUILD_NICE (default 19): the builds' nice level, so they yield to other
#   work on a shared machine; the rounds run at the caller's priority.
#   BEFORE_BIN, AFTER_BIN: mailroom-bench binaries already built from BEFORE
#   and from this checkout (their own release builds); that side is not built.
#
# The two builds need two target directories: cargo gives a workspace
# crate the same artifact name whatever its checkout's path, and judges
# freshness by file times, so a build of this checkout in the directory
# the BEFORE worktree (checked out just now, newer files) was built in
# takes BEFORE's crates for its own.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 64
fi
before=$1
rounds=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
opts=("$@")
build_nice=${BUILD_NICE:-19}
[[ ${#opts[@]} -gt 0 ]] || opts=(--modes single)
store=${STORE:-${MAILROOM_TEST_POSTGRES_URL:-}}
[[ -n $store ]] || { echo "compare.sh: set STORE or MAILROOM_TEST_POSTGRES_URL" >&2; exit 64; }

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
before_sha=$(git -C "$repo" rev-parse --verify "$before^{commit}")
after_sha=$(git -C "$repo" rev-parse HEAD)
target=${CARGO_TARGET_DIR:-$repo/target}
before_target=${BEFORE_TARGET_DIR:-$target/compare-before}
[[ $before_target != "$target" ]] || { echo "compare.sh: BEFORE_TARGET_DIR must differ from CARGO_TARGET_DIR" >&2; exit 64; }
work=$(mktemp -d /tmp/mailroom-compare.XXXXXX)
cleanup() {
    git -C "$repo" worktree remove --force "$work/before" 2>/dev/null || true
    if [[ ${KEEP:-0} == 1 ]]; then
        rm -rf "$work/before"
        echo "compare.sh: JSON kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

if [[ -n ${BEFORE_BIN:-} ]]; then
    echo "compare.sh: before ${before_sha:0:10} is $BEFORE_BIN (not built)" >&2
    cp "$BEFORE_BIN" "$work/bench-before"
else
git -C "$repo" worktree add --quiet --detach "$work/before" "$before_sha"
if [[ ${BENCH:-current} == current ]]; then
    rm -rf "$work/before/crates/mailroom-bench"
    cp -r "$repo/crates/mailroom-bench" "$work/before/crates/mailroom-bench"
fi
build_before() {
    (cd "$work/before" && CARGO_TARGET_DIR=$before_target nice -n "$build_nice" cargo build --quiet --release -p mailroom-bench)
}
echo "compare.sh: building before ${before_sha:0:10} (bench: ${BENCH:-current})" >&2
if ! build_before 2>"$work/build-before.log"; then
    # The pass-through store (src/counting.rs) implements the Store trait of
    # its own commit: when the trait has changed since BEFORE, keep BEFORE's.
    [[ ${BENCH:-current} == current ]] || { cat "$work/build-before.log" >&2; exit 1; }
    echo "compare.sh: retrying with BEFORE's own src/counting.rs (its Store trait differs)" >&2
    git -C "$work/before" checkout -- crates/mailroom-bench/src/counting.rs
    build_before
fi
cp "$before_target/release/mailroom-bench" "$work/bench-before"
fi
if [[ -n ${AFTER_BIN:-} ]]; then
    echo "compare.sh: after ${after_sha:0:10} is $AFTER_BIN (not built)" >&2
    cp "$AFTER_BIN" "$work/bench-after"
else
echo "compare.sh: building after ${after_sha:0:10} ($repo$(git -C "$repo" diff --quiet HEAD || echo ', uncommitted changes included'))" >&2
(cd "$repo" && CARGO_TARGET_DIR=$target nice -n "$build_nice" cargo build --quiet --release -p mailroom-bench)
cp "$target/release/mailroom-bench" "$work/bench-after"
fi

for ((r = 1; r <= rounds; r++)); do
    order=(before after)
    (( r % 2 == 0 )) && order=(after before)
    for side in "${order[@]}"; do
        echo "compare.sh: round $r/$rounds: $side (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        RUST_LOG=${RUST_LOG:-error} "$work/bench-$side" drain --store "$store" --json "${opts[@]}" \
            >"$work/$side-$r.json"
    done
done

python3 - "$work" "$rounds" "${before_sha:0:10}" "${after_sha:0:10}" <<'EOF'
import json, statistics, sys

work, rounds, before, after = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def load(side, r):
    with open(f"{work}/{side}-{r}.json") as f:
        return {m["mode"]: m for m in json.load(f)["modes"]}

def figures(m):
    db = m.get("db") or {}
    return {
        "events/s": m["events_per_sec"],
        "pg CPU-s/1k": db.get("cpu_secs_per_1k"),
        "WAL MiB/1k": None if db.get("wal_bytes_per_1k") is None else db["wal_bytes_per_1k"] / 2**20,
        "WAL rec/ev": db.get("wal_records_per_event"),
        "FPI/ev": db.get("wal_fpi_per_event"),
        "ev/pg CPU-s": db.get("events_per_cpu_sec"),
    }

def cell(v, name):
    if v is None:
        return "-"
    if name in ("events/s", "ev/pg CPU-s"):
        return f"{v:,.0f}"
    return f"{v:.3f}" if name == "pg CPU-s/1k" else f"{v:.2f}"

data = {(side, r): load(side, r) for side in ("before", "after") for r in range(1, rounds + 1)}
modes = list(data[("after", 1)].keys())
names = list(figures(data[("after", 1)][modes[0]]).keys())
# Full-page images follow checkpoints (other sessions' DROP DATABASE forces
# one), not the schema, and add bytes and records (hint-bit images): such
# rounds' WAL figures are flagged with * and left out of the WAL medians
# when rounds without them exist.
WAL = ("WAL MiB/1k", "WAL rec/ev")


def fpi_free(f):
    return (f["FPI/ev"] or 0) < 0.01
print(f"compare: before {before}, after {after}; {rounds} alternating rounds on one server")
for mode in modes:
    print(f"\n{mode}:")
    print(f"{'round':<7}{'build':<8}" + "".join(f"{n:>14}" for n in names))
    ratios = {n: [] for n in names}
    for r in range(1, rounds + 1):
        fb, fa = figures(data[("before", r)][mode]), figures(data[("after", r)][mode])
        for side, f in (("before", fb), ("after", fa)):
            flag = lambda n: "*" if n in WAL and not fpi_free(f) else ""
            print(f"{r:<7}{side:<8}" + "".join(f"{cell(f[n], n) + flag(n):>14}" for n in names))
        row = []
        for n in names:
            ok = n != "FPI/ev" and bool(fb[n]) and fa[n] is not None
            row.append(f"{fa[n] / fb[n]:.2f}x" if ok else "-")
            if ok:
                ratios[n].append((fa[n] / fb[n], fpi_free(fb) and fpi_free(fa)))
        print(f"{r:<7}{'a/b':<8}" + "".join(f"{c:>14}" for c in row))

    def med(n):
        xs = ratios[n]
        if n in WAL and any(clean for _, clean in xs):
            xs = [x for x in xs if x[1]]
        return f"{statistics.median(x for x, _ in xs):.2f}x" if xs else "-"
    print(f"{'median':<7}{'a/b':<8}" + "".join(f"{med(n):>14}" for n in names))
print("\n* full-page images in that round (a checkpoint during the drain): its WAL figures are"
      " inflated, and the WAL medians leave such rounds out when others exist")
EOF

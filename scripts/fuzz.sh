#!/usr/bin/env bash
#
# Runs every cargo-fuzz target in fuzz/ for a time budget each.
#
#   scripts/fuzz.sh 60s                 every target, 60 s each
#   scripts/fuzz.sh 20s config api      only these targets
#
# The budget is "<n>s", "<n>m" or plain seconds. cargo-fuzz is installed
# (`cargo install cargo-fuzz --locked`) into fuzz/.tools when it is not on
# PATH; the nightly toolchain is used when rustup has it, else stable with
# RUSTC_BOOTSTRAP=1. Builds go to $CARGO_TARGET_DIR/fuzz (default
# fuzz/target).
#
# FUZZ_SANITIZER picks cargo-fuzz's sanitizer: `none` by default (libFuzzer
# with coverage, no ASan: the targets are safe Rust, their oracles are
# panics and wrong answers, and the build takes about 28 min at nice 19 on
# 2 loaded cores, where the ASan build had not finished after 35 min), or
# `address` (also checks the bundled SQLite's C for memory errors). What the fuzzer discovers goes to a temp dir (the committed
# seeds in fuzz/corpus/<target>/ stay small); a crash is saved in
# fuzz/artifacts/<target>/ and makes the script exit non-zero after the
# other targets ran. See fuzz/README.md.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ="$REPO_ROOT/fuzz"

budget="${1:-}"
[[ -n "$budget" ]] || { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }
shift
case "$budget" in
  *m) secs=$(( ${budget%m} * 60 )) ;;
  *s) secs=${budget%s} ;;
  *) secs=$budget ;;
esac
[[ "$secs" =~ ^[0-9]+$ && "$secs" -gt 0 ]] || { echo "fuzz.sh: bad budget $budget" >&2; exit 2; }

log() { printf '[%(%H:%M:%S)T] fuzz: %s\n' -1 "$*" >&2; }

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  export PATH="$FUZZ/.tools/bin:$PATH"
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    log "installing cargo-fuzz into fuzz/.tools"
    cargo install cargo-fuzz --locked --root "$FUZZ/.tools"
  fi
fi

toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  export RUSTC_BOOTSTRAP=1
fi

# The same flags for build and run, or `run` rebuilds.
flags=(--sanitizer "${FUZZ_SANITIZER:-none}")

target_dir="${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}"
target_dir="${target_dir:-$FUZZ/target}"
cd "$FUZZ"
if (($#)); then targets=("$@"); else mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list); fi

started=$SECONDS
log "building ${targets[*]}"
cargo "${toolchain[@]}" fuzz build "${flags[@]}" --target-dir "$target_dir"
log "built in $((SECONDS - started)) s"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "corpus/$t"
  log "$t: ${secs} s"
  if ! cargo "${toolchain[@]}" fuzz run "${flags[@]}" --target-dir "$target_dir" "$t" "$work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -print_final_stats=1 2>"$work/$t.log"; then
    failed+=("$t")
    tail -n 60 "$work/$t.log" >&2
  fi
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$work/$t.log" | sed "s/^/  $t /" >&2 || true
done
log "done in $((SECONDS - started)) s"
if ((${#failed[@]})); then
  log "crashes in: ${failed[*]} (inputs in fuzz/artifacts/<target>/)"
  exit 1
fi

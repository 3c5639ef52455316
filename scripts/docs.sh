#!/usr/bin/env bash
#
# The docs book (docs/book.toml, pages under docs/src/):
#
#   scripts/docs.sh build   build it into docs/book/ (fails on a missing page)
#   scripts/docs.sh serve   build it, then serve docs/book/ on
#                           http://127.0.0.1:3000 (PORT=... to change) until Ctrl-C
#   scripts/docs.sh install only install mdBook (scripts/test.sh --prepare)
#
# Installs mdBook from crates.io when the pinned version is not on PATH
# (cargo install --locked, search only: no live-reload server to build;
# a few minutes on two cores, once per machine).

set -euo pipefail

MDBOOK_VERSION=0.5.4
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

ensure_mdbook() {
  if command -v mdbook >/dev/null 2>&1 && [[ "$(mdbook --version)" == "mdbook v$MDBOOK_VERSION" ]]; then
    return
  fi
  echo "docs.sh: installing mdbook $MDBOOK_VERSION (cargo install)" >&2
  # Its own target dir: the workspace's build settings stay out of it.
  local build_dir
  build_dir="$(mktemp -d)"
  CARGO_TARGET_DIR="$build_dir" cargo install mdbook --locked --version "$MDBOOK_VERSION" \
    --no-default-features --features search
  rm -rf "$build_dir"
  hash -r
  [[ "$(mdbook --version)" == "mdbook v$MDBOOK_VERSION" ]] ||
    { echo "docs.sh: mdbook $MDBOOK_VERSION not on PATH after install ($(command -v mdbook))" >&2; exit 1; }
}

case "${1:-}" in
  install)
    ensure_mdbook
    ;;
  build)
    ensure_mdbook
    mdbook build "$REPO_ROOT/docs"
    ;;
  serve)
    ensure_mdbook
    mdbook build "$REPO_ROOT/docs"
    port="${PORT:-3000}"
    echo "docs.sh: http://127.0.0.1:$port/ (Ctrl-C to stop; run again after an edit)" >&2
    exec python3 -m http.server --bind 127.0.0.1 --directory "$REPO_ROOT/docs/book" "$port"
    ;;
  *)
    sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

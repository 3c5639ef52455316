#!/usr/bin/env bash
#
# A private RabbitMQ node for a test that stops and starts its broker (the
# shared node of ./scripts/test.sh serves every other test and is never
# restarted):
#
#   scripts/rabbit-node.sh start DIR   first call: a new node with its state
#                                      in DIR (created), on free loopback
#                                      ports. After `stop`: the same node
#                                      again, same ports, same data (durable
#                                      queues and persistent messages are
#                                      still there). Prints the AMQP URL on
#                                      stdout once the node answers the
#                                      AMQP handshake.
#   scripts/rabbit-node.sh stop DIR    SIGTERM: a clean broker shutdown
#                                      (clients get connection.close 320);
#                                      DIR is kept for the next `start`.
#   scripts/rabbit-node.sh down DIR    stop, then delete DIR.
#
# Progress goes to stderr. Same layout and functions as the test services
# (scripts/lib/services.sh): as root the node runs as `rabbitmq`, so DIR's
# parent must be reachable by that user (/tmp is; $TMPDIR under /root is not).
# Needs rabbitmq-server installed (scripts/test.sh installs it).

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/services.sh
source "$REPO_ROOT/scripts/lib/services.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

(($# == 2)) || usage
verb="$1"
MR_STATE="$(realpath -m -- "$2")"

case "$verb" in
  start)
    [[ -x "$MR_RABBIT_BIN/rabbitmq-server" ]] ||
      mr_die "rabbitmq-server not found in $MR_RABBIT_BIN (./scripts/test.sh installs it)"
    if [[ -f "$MR_STATE/amqp.port" ]]; then
      # A restart: the node's name and data directory follow from its port.
      [[ -f "$MR_STATE/rabbit.pgid" ]] && mr_die "the node in $MR_STATE is running"
      mr_rabbit_ports
      # The ports were free when picked; a port in TIME_WAIT or a slow
      # epmd exit can make the first launch fail.
      for attempt in 1 2 3; do
        mr_rabbit_launch && break
        mr_rabbit_stop || true
        ((attempt < 3)) || mr_die "RabbitMQ did not start again (state in $MR_STATE)"
        sleep 2
      done
    else
      mr_state_init "$MR_STATE" rabbit
      mr_rabbit_start
    fi
    echo "$MR_AMQP_URL"
    ;;
  stop)
    mr_rabbit_stop
    ;;
  down)
    mr_rabbit_stop || true
    rm -rf -- "$MR_STATE"
    ;;
  *) usage ;;
esac

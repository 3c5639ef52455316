# shellcheck shell=bash
#
# Throwaway PostgreSQL 15 (plain, and a TLS-only cluster) + RabbitMQ for
# mailroom's tests.
#
# Sourced by scripts/test.sh and scripts/services.sh; not meant to be run.
# Everything lives in one state directory ($MR_STATE) so that teardown is
# "stop what is recorded there, then rm -rf it":
#
#   $MR_STATE/
#     env               export lines (MAILROOM_TEST_POSTGRES_URL, MAILROOM_TEST_POSTGRES_TLS_URL,
#                       MAILROOM_TEST_AMQP_URL, MAILROOM_TEST_AMQPS_URL, MAILROOM_TEST_TLS_DIR,
#                       MAILROOM_TEST_PGBOUNCER_URL)
#     tls/              the test CA and certificates (mr_tls_certs)
#     pg/data           PostgreSQL cluster (owned by `postgres` when run as root);
#                       its unix socket lives here too
#     pg/server.log     PostgreSQL server log
#     pgtls/            a second cluster that accepts only TLS: data/, server.log,
#                       its own 0600 copies of server.pem, server.key, ca.pem
#     pgbouncer/        PgBouncer in transaction mode in front of pg/: config,
#                       auth file, log, pid (owned by `postgres` when run as root)
#     rabbit/           RabbitMQ private node: HOME (erlang cookie), mnesia, logs,
#                       config, pid file (owned by `rabbitmq` when run as root)
#     rabbit.pgid       process group of the node (started under setsid)
#     epmd.pid          private epmd (its own port, loopback only)
#
# Nothing here touches the system postgresql/rabbitmq services, the default
# ports (5432, 5672, 4369, 25672) or /etc config: every port is picked at
# random among free ones and every config/data path points into $MR_STATE.

MR_PG_BIN="${MR_PG_BIN:-/usr/lib/postgresql/15/bin}"
MR_RABBIT_BIN="${MR_RABBIT_BIN:-/usr/lib/rabbitmq/bin}"
MR_PG_USER="postgres"              # superuser role created by initdb
MR_START_TIMEOUT="${MR_START_TIMEOUT:-90}"   # seconds per server

mr_log()  { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mr_die()  { printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }
mr_now()  { date +%s.%N; }
mr_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1fs", e - s }'; }

mr_is_root() { [[ "$(id -u)" -eq 0 ]]; }

# Run a command as a service account when we are root (PostgreSQL refuses
# to run as root; RabbitMQ's files must belong to `rabbitmq`). As an
# ordinary developer the servers simply run as that developer.
mr_as() {
  local user="$1"; shift
  if mr_is_root; then
    runuser -u "$user" -- "$@"
  else
    "$@"
  fi
}

# Start "$@" (as service account $1 when root) in the background, in a new
# session, so its pid is also its process group id; write that to $2 and
# send its output to $3.
mr_spawn() {
  local user="$1" pidfile="$2" out="$3"; shift 3
  if mr_is_root; then
    setsid runuser -u "$user" -- "$@" >"$out" 2>&1 </dev/null &
  else
    setsid "$@" >"$out" 2>&1 </dev/null &
  fi
  echo $! >"$pidfile"
}

mr_sudo() {
  if mr_is_root; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else mr_die "need root (or sudo) to run: $*"
  fi
}

# ---------------------------------------------------------------- packages --

mr_apt_install() {
  # Non-interactive, keep existing conffiles, wait for a concurrent apt/dpkg;
  # three tries, since a mirror hiccup should not fail a CI run.
  local start try; start="$(mr_now)"
  for try in 1 2 3; do
    mr_log "apt-get update (try $try/3)"
    if mr_sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq update &&
      mr_log "apt-get install $*" &&
      mr_sudo env DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a apt-get \
        -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        -y -qq --no-install-recommends --no-upgrade install "$@" >/dev/null; then
      mr_log "apt-get install done in $(mr_since "$start")"
      return 0
    fi
    ((try < 3)) && sleep $((try * 10))
  done
  mr_die "apt-get install $* failed 3 times"
}

mr_ensure_packages() {
  local missing=()
  [[ -x "$MR_PG_BIN/initdb" && -x "$MR_PG_BIN/pg_ctl" ]] || missing+=(postgresql-15)
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client-15)
  [[ -x "$MR_RABBIT_BIN/rabbitmq-server" ]] && command -v epmd >/dev/null 2>&1 || missing+=(rabbitmq-server)
  # The relay test reads what mailroom published with a consumer in another
  # language: Python's pika (apt's, so the system interpreter's, whatever
  # `python3` is first on PATH).
  /usr/bin/python3 -c 'import pika' >/dev/null 2>&1 || missing+=(python3-pika)
  # The outbox example (examples/outbox-python) runs on psycopg 3.
  /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1 || missing+=(python3-psycopg)
  # Tests run mailroom through a transaction-mode pooler too.
  command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer)
  if ((${#missing[@]})); then
    mr_apt_install "${missing[@]}"
  else
    mr_log "packages present: postgresql-15, rabbitmq-server, python3-pika, python3-psycopg, pgbouncer"
  fi
  [[ -x "$MR_PG_BIN/initdb" ]] || mr_die "initdb not found in $MR_PG_BIN after install"
  [[ -x "$MR_RABBIT_BIN/rabbitmq-server" ]] || mr_die "rabbitmq-server not found in $MR_RABBIT_BIN after install"
  if mr_is_root; then
    id postgres >/dev/null 2>&1 || mr_die "user 'postgres' missing (postgresql-15 install incomplete?)"
    id rabbitmq >/dev/null 2>&1 || mr_die "user 'rabbitmq' missing (rabbitmq-server install incomplete?)"
  fi
}

# ------------------------------------------------------------------- ports --

# True if something accepts TCP connections on 127.0.0.1:$1.
mr_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port that is free right now (random, in 20000-59999). Ports already
# handed out by this script are remembered so the four we need never collide.
MR_PORTS_TAKEN=" "
mr_free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    [[ "$MR_PORTS_TAKEN" == *" $p "* ]] && continue
    mr_port_busy "$p" && continue
    # Also skip ports that are bound but not listening (e.g. by a client).
    if command -v ss >/dev/null 2>&1 && ss -Htan "( sport = :$p )" 2>/dev/null | grep -q .; then continue; fi
    MR_PORTS_TAKEN+="$p "
    echo "$p"; return 0
  done
  mr_die "could not find a free TCP port"
}

mr_tail() {
  local f
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2 || true
  done
  echo "-----" >&2
}

# ------------------------------------------------------------------- state --

# Where state dirs go. As root the servers run as postgres/rabbitmq, which
# must be able to traverse the path: $TMPDIR may be under /root, so use /tmp.
mr_tmp_base() {
  if mr_is_root; then echo /tmp; else echo "${TMPDIR:-/tmp}"; fi
}

mr_state_init() {
  # $1: state dir to create (must not exist or be empty); $2...: the
  # services to make room for, `pg`, `pgtls`, `pgbouncer` and/or `rabbit`
  # (default: all).
  MR_STATE="$1"; shift
  local service user
  mkdir -p "$MR_STATE"
  # Service accounts must be able to traverse into it.
  chmod 0755 "$MR_STATE"
  (($#)) || set -- pg pgtls pgbouncer rabbit
  for service in "$@"; do
    case "$service" in
      pg | pgtls | pgbouncer) user=postgres ;;
      rabbit) user=rabbitmq ;;
      *) mr_die "mr_state_init: unknown service $service" ;;
    esac
    mkdir -p "$MR_STATE/$service"
    if mr_is_root; then chown "$user": "$MR_STATE/$service"; fi
    chmod 0700 "$MR_STATE/$service"
  done
}

# ------------------------------------------------------------ certificates --

# Makes the tests' certificates with openssl in $MR_STATE/tls. Everything
# there is world-readable: a server copies the key it serves into a
# directory of its own, owned by its account (PostgreSQL refuses a key that
# others can read).
#   ca.pem ca.key            the test CA that tests trust
#   other-ca.pem             an unrelated CA (the "wrong CA" of negative tests)
#   server.pem server.key    localhost, 127.0.0.1 and ::1, signed by ca, 2 days
#   expired.pem expired.key  the same names, signed by ca, expired in 2020
#   client.pem client.key    CN=mailroom, a client certificate signed by ca
# Sets MR_TLS_DIR (exported as MAILROOM_TEST_TLS_DIR by mr_write_env).
mr_tls_certs() {
  local d="$MR_STATE/tls" start
  start="$(mr_now)"
  command -v openssl >/dev/null 2>&1 || mr_apt_install openssl
  mkdir -p "$d/ca-db"
  (
    set -e
    cd "$d"
    exec >openssl.log 2>&1
    for ca in ca other-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -days 3 -subj "/CN=mailroom test $ca" \
        -keyout "$ca.key" -out "$ca.pem" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign
    done
    printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1' \
      'extendedKeyUsage=serverAuth' 'basicConstraints=CA:FALSE' >server.ext
    printf '%s\n' 'extendedKeyUsage=clientAuth' 'basicConstraints=CA:FALSE' >client.ext
    for leaf in server:localhost client:mailroom; do
      openssl req -new -newkey rsa:2048 -nodes -subj "/CN=${leaf#*:}" \
        -keyout "${leaf%%:*}.key" -out "${leaf%%:*}.csr"
      openssl x509 -req -in "${leaf%%:*}.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days 2 -extfile "${leaf%%:*}.ext" -out "${leaf%%:*}.pem"
    done
    # An expired certificate needs explicit dates, which `openssl ca` takes.
    : >ca-db/index.txt
    echo 1000 >ca-db/serial
    printf '%s\n' '[ca]' 'default_ca = test' '[test]' 'database = ca-db/index.txt' \
      'serial = ca-db/serial' 'new_certs_dir = ca-db' 'default_md = sha256' \
      'policy = any' '[any]' 'commonName = supplied' >ca.cnf
    openssl req -new -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout expired.key -out expired.csr
    openssl ca -batch -notext -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
      -startdate 20200101000000Z -enddate 20200102000000Z -extfile server.ext -out expired.pem
    chmod 0755 .
    chmod 0644 ./*.pem ./*.key
  ) || { mr_tail "$d/openssl.log"; mr_die "making the test certificates failed"; }
  MR_TLS_DIR="$d"
  mr_log "TLS: test CA and certificates in $d ($(mr_since "$start"))"
}

# -------------------------------------------------------------- PostgreSQL --

# initdb for the cluster in $MR_STATE/$1/data.
mr_pg_init() {
  local sub="$1"
  mr_log "PostgreSQL ($sub): initdb"
  mr_as postgres "$MR_PG_BIN/initdb" -D "$MR_STATE/$sub/data" -U "$MR_PG_USER" --auth=trust \
    -E UTF8 --locale=C.UTF-8 --no-sync >"$MR_STATE/$sub/initdb.log" 2>&1 \
    || { mr_tail "$MR_STATE/$sub/initdb.log"; mr_die "initdb ($sub) failed"; }
}

# Starts the cluster mr_pg_init made in $MR_STATE/$1 on a free loopback
# port, with the server settings $2 (`-c name=value ...`, may be empty),
# and waits until the superuser logs in over TCP with the libpq connection
# parameters $3 (e.g. `sslmode=require`, may be empty). Records the port
# in $MR_STATE/$1.port and sets MR_PG_PORT.
mr_pg_launch() {
  local sub="$1" settings="$2" conninfo="${3:-}" attempt port
  local pgdata="$MR_STATE/$sub/data" log="$MR_STATE/$sub/server.log"
  for attempt in 1 2 3; do
    port="$(mr_free_port)"
    mr_log "PostgreSQL ($sub): starting on 127.0.0.1:$port (attempt $attempt)"
    if mr_as postgres "$MR_PG_BIN/pg_ctl" -D "$pgdata" -l "$log" -w -t "$MR_START_TIMEOUT" \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='$pgdata' \
            -c fsync=on -c synchronous_commit=on -c max_connections=300 \
            -c log_min_messages=warning $settings" \
        start >>"$MR_STATE/$sub/pg_ctl.log" 2>&1; then
      echo "$port" >"$MR_STATE/$sub.port"
      break
    fi
    # Lost a race for the port, or a real failure: show why, maybe retry.
    mr_tail "$log" "$MR_STATE/$sub/pg_ctl.log"
    mr_as postgres "$MR_PG_BIN/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
    grep -qi 'address already in use' "$log" 2>/dev/null || mr_die "PostgreSQL ($sub) failed to start"
  done
  [[ -f "$MR_STATE/$sub.port" ]] || mr_die "PostgreSQL ($sub) failed to start (ports in use)"
  # pg_ctl -w says the postmaster is up; prove it accepts TCP logins from us.
  local deadline=$((SECONDS + MR_START_TIMEOUT))
  until mr_pg_answers "$port" "$conninfo"; do
    if ((SECONDS > deadline)); then
      mr_tail "$log"
      mr_die "PostgreSQL ($sub) on 127.0.0.1:$port does not accept connections after ${MR_START_TIMEOUT}s"
    fi
    sleep 0.2
  done
  MR_PG_PORT="$port"
}

# True if the superuser runs `SELECT 1` on 127.0.0.1:$1 over TCP, with the
# extra libpq connection parameters $2 (may be empty); with more arguments,
# runs psql with those instead of `-c 'SELECT 1'`.
mr_pg_answers() {
  local port="$1" conninfo="${2:-}"
  shift $(($# < 2 ? $# : 2))
  (($#)) || set -- -c 'SELECT 1'
  psql -X -q "host=127.0.0.1 port=$port user=$MR_PG_USER dbname=postgres $conninfo" "$@" >/dev/null 2>&1
}

mr_pg_start() {
  local start; start="$(mr_now)"
  mr_pg_init pg
  mr_pg_launch pg ""
  MR_PG_URL="postgres://$MR_PG_USER@127.0.0.1:$MR_PG_PORT/postgres"
  mr_log "PostgreSQL: ready ($MR_PG_URL) in $(mr_since "$start")"
}

# A second cluster, in $MR_STATE/pgtls, that accepts only TLS with the
# server certificate of mr_tls_certs: hostssl lines only, the superuser by
# trust, the role `mailroom` by its client certificate (client.pem,
# CN=mailroom, signed by ca.pem). Sets MR_PG_TLS_URL.
mr_pg_tls_start() {
  local start d="$MR_STATE/pgtls"
  start="$(mr_now)"
  mr_pg_init pgtls
  # PostgreSQL refuses a key that others can read: its own copies, 0600.
  mr_as postgres install -m 0600 "$MR_TLS_DIR/server.pem" "$MR_TLS_DIR/server.key" \
    "$MR_TLS_DIR/ca.pem" "$d/" || mr_die "PostgreSQL (pgtls): cannot copy the certificates"
  printf '%s\n' '# TLS only: no host or local line, so every plain connection is refused.' \
    'hostssl all postgres 127.0.0.1/32 trust' \
    'hostssl all mailroom 127.0.0.1/32 cert' \
    | mr_as postgres sh -c "cat >'$d/data/pg_hba.conf'"
  mr_pg_launch pgtls "-c ssl=on -c ssl_cert_file='$d/server.pem' -c ssl_key_file='$d/server.key' \
    -c ssl_ca_file='$d/ca.pem'" "sslmode=require"
  mr_pg_answers "$MR_PG_PORT" "sslmode=require" -c 'CREATE ROLE mailroom LOGIN' \
    || mr_die "PostgreSQL (pgtls): cannot create the role mailroom"
  MR_PG_TLS_URL="postgres://$MR_PG_USER@localhost:$MR_PG_PORT/postgres"
  mr_log "PostgreSQL (TLS only): ready ($MR_PG_TLS_URL) in $(mr_since "$start")"
}

mr_pg_stop() {
  # $1: the cluster's sub-dir of $MR_STATE (default: pg).
  local sub="${1:-pg}"
  local pgdata="$MR_STATE/$sub/data"
  [[ -f "$pgdata/postmaster.pid" ]] || return 0
  mr_log "PostgreSQL ($sub): stopping"
  # immediate: no shutdown checkpoint, the data is deleted right after.
  mr_as postgres "$MR_PG_BIN/pg_ctl" -D "$pgdata" -m immediate -t 30 -w stop >/dev/null 2>&1 \
    || {
      local pid; pid="$(head -n1 "$pgdata/postmaster.pid" 2>/dev/null || true)"
      [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
    }
}

# --------------------------------------------------------------- PgBouncer --

# PgBouncer in transaction mode in front of the test PostgreSQL (mr_pg_start
# first), on a free loopback port: every database name is passed through
# (`* =`), so the per-test databases are reachable too. Sets MR_PGBOUNCER_URL.
mr_pgbouncer_start() {
  local start attempt port b="$MR_STATE/pgbouncer" pg_port bin
  start="$(mr_now)"
  pg_port="$(cat "$MR_STATE/pg.port")"
  bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
  for attempt in 1 2 3; do
    port="$(mr_free_port)"
    mr_as postgres sh -c "
      echo '\"$MR_PG_USER\" \"\"' >'$b/userlist.txt'
      cat >'$b/pgbouncer.ini' <<EOF
[databases]
* = host=127.0.0.1 port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $b/userlist.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 40
max_db_connections = 200
server_lifetime = 3600
server_idle_timeout = 60
logfile = $b/pgbouncer.log
pidfile = $b/pgbouncer.pid
admin_users = $MR_PG_USER
EOF"
    mr_log "PgBouncer: starting on 127.0.0.1:$port, transaction mode (attempt $attempt)"
    mr_as postgres "$bin" -d "$b/pgbouncer.ini" >>"$b/start.log" 2>&1 || true
    local deadline=$((SECONDS + 15))
    until mr_pg_answers "$port"; do
      ((SECONDS > deadline)) && break
      sleep 0.2
    done
    if mr_pg_answers "$port"; then
      echo "$port" >"$MR_STATE/pgbouncer.port"
      break
    fi
    mr_tail "$b/pgbouncer.log" "$b/start.log"
    mr_pgbouncer_stop
  done
  [[ -f "$MR_STATE/pgbouncer.port" ]] || mr_die "PgBouncer failed to start"
  MR_PGBOUNCER_URL="postgres://$MR_PG_USER@127.0.0.1:$port/postgres"
  mr_log "PgBouncer: ready ($MR_PGBOUNCER_URL) in $(mr_since "$start")"
}

mr_pgbouncer_stop() {
  local f="$MR_STATE/pgbouncer/pgbouncer.pid" pid i
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ -n "$pid" ]] || return 0
  mr_log "PgBouncer: stopping"
  kill -INT "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
}

# ---------------------------------------------------------------- RabbitMQ --

# Send the AMQP 0-9-1 protocol header; a broker answers with a method frame
# (type 1) carrying Connection.Start. Succeeds only if that happens.
mr_amqp_handshake() {
  local port="$1" first
  first="$(timeout 5 bash -c '
      exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
      printf "AMQP\x00\x00\x09\x01" >&3
      head -c 1 <&3 | od -An -tu1' "$port" 2>/dev/null | tr -d ' ')" || return 1
  [[ "$first" == "1" ]]
}

mr_rabbit_env() {
  # Environment of the private node: every path in $MR_STATE/rabbit, every
  # port private. RABBITMQ_CONF_ENV_FILE points to an empty file so that
  # /etc/rabbitmq/rabbitmq-env.conf is not read.
  local r="$MR_STATE/rabbit"
  echo HOME="$r/home"
  echo RABBITMQ_NODENAME="mailroom$MR_AMQP_PORT@localhost"
  echo RABBITMQ_USE_LONGNAME=false
  echo RABBITMQ_CONF_ENV_FILE="$r/rabbitmq-env.conf"
  echo RABBITMQ_CONFIG_FILE="$r/rabbitmq.conf"
  echo RABBITMQ_ADVANCED_CONFIG_FILE="$r/advanced.config"
  echo RABBITMQ_ENABLED_PLUGINS_FILE="$r/enabled_plugins"
  echo RABBITMQ_MNESIA_BASE="$r/mnesia"
  echo RABBITMQ_LOG_BASE="$r/log"
  echo RABBITMQ_PID_FILE="$r/rabbit.pid"
  echo RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  echo RABBITMQ_NODE_PORT="$MR_AMQP_PORT"
  echo RABBITMQ_DIST_PORT="$MR_DIST_PORT"
  echo ERL_EPMD_PORT="$MR_EPMD_PORT"
  echo ERL_EPMD_ADDRESS=127.0.0.1
  echo RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

# Picks the node's ports and writes its config into $MR_STATE/rabbit.
# The ports are recorded in $MR_STATE/{amqp,dist,epmd}.port, so that a
# later mr_rabbit_launch (after mr_rabbit_stop) brings the same node back on
# the same ports with the same data (scripts/rabbit-node.sh).
# With MR_TLS_DIR set (mr_tls_certs), the node also gets a TLS listener on
# a port of its own (amqps.port) serving server.pem, signed by ca.pem: it
# asks each client for a certificate and checks one against ca.pem, but
# lets a client without one in (verify_peer, fail_if_no_peer_cert = false).
mr_rabbit_configure() {
  local r="$MR_STATE/rabbit" tls=""
  MR_AMQP_PORT="$(mr_free_port)"
  MR_DIST_PORT="$(mr_free_port)"
  MR_EPMD_PORT="$(mr_free_port)"
  MR_AMQPS_PORT=""
  mr_as rabbitmq mkdir -p "$r/home" "$r/mnesia" "$r/log"
  if [[ -n "${MR_TLS_DIR:-}" ]]; then
    MR_AMQPS_PORT="$(mr_free_port)"
    mr_as rabbitmq mkdir -p "$r/tls"
    mr_as rabbitmq cp "$MR_TLS_DIR/ca.pem" "$MR_TLS_DIR/server.pem" "$MR_TLS_DIR/server.key" "$r/tls/"
    mr_as rabbitmq chmod 0600 "$r/tls/server.key"
    tls="listeners.ssl.default = 127.0.0.1:$MR_AMQPS_PORT
ssl_options.cacertfile = $r/tls/ca.pem
ssl_options.certfile = $r/tls/server.pem
ssl_options.keyfile = $r/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false"
  fi
  mr_as rabbitmq sh -c "
    : >'$r/rabbitmq-env.conf'
    echo '[].' >'$r/advanced.config'
    echo '[].' >'$r/enabled_plugins'
    cat >'$r/rabbitmq.conf' <<EOF
listeners.tcp.1 = 127.0.0.1:$MR_AMQP_PORT
$tls
loopback_users.guest = true
log.file.level = info
log.console = false
EOF
    chmod 0700 '$r/home'
  "
  echo "$MR_AMQP_PORT" >"$MR_STATE/amqp.port"
  echo "$MR_DIST_PORT" >"$MR_STATE/dist.port"
  echo "$MR_EPMD_PORT" >"$MR_STATE/epmd.port"
  if [[ -n "$MR_AMQPS_PORT" ]]; then echo "$MR_AMQPS_PORT" >"$MR_STATE/amqps.port"; fi
}

# Reads back the ports mr_rabbit_configure recorded in $MR_STATE.
mr_rabbit_ports() {
  MR_AMQPS_PORT="$(cat "$MR_STATE/amqps.port" 2>/dev/null || true)"
  MR_AMQP_PORT="$(cat "$MR_STATE/amqp.port")" &&
    MR_DIST_PORT="$(cat "$MR_STATE/dist.port")" &&
    MR_EPMD_PORT="$(cat "$MR_STATE/epmd.port")"
}

# Starts the configured node (its own epmd first) and waits until it
# answers the AMQP handshake; sets MR_AMQP_URL.
mr_rabbit_launch() {
  local start r="$MR_STATE/rabbit"
  start="$(mr_now)"
  local -a env; mapfile -t env < <(mr_rabbit_env)

  # Our own epmd, in the foreground of its own session, so we know its pid
  # and can stop it (erl would otherwise daemonize one that outlives us).
  mr_spawn rabbitmq "$MR_STATE/epmd.pid" "$MR_STATE/epmd.log" \
    env "${env[@]}" epmd -port "$MR_EPMD_PORT" -address 127.0.0.1
  local deadline=$((SECONDS + 15))
  until mr_port_busy "$MR_EPMD_PORT"; do
    ((SECONDS < deadline)) || { mr_tail "$MR_STATE/epmd.log"; mr_log "epmd did not start on port $MR_EPMD_PORT"; return 1; }
    sleep 0.1
  done

  mr_log "RabbitMQ: starting private node on 127.0.0.1:$MR_AMQP_PORT (dist $MR_DIST_PORT, epmd $MR_EPMD_PORT)"
  # The node gets its own process group, which teardown signals as a whole
  # (runuser, the rabbitmq-server shell, beam.smp and its helpers).
  mr_spawn rabbitmq "$MR_STATE/rabbit.pgid" "$MR_STATE/rabbit.out" \
    env "${env[@]}" "$MR_RABBIT_BIN/rabbitmq-server"
  local pid; pid="$(cat "$MR_STATE/rabbit.pgid")"

  deadline=$((SECONDS + MR_START_TIMEOUT))
  until mr_amqp_handshake "$MR_AMQP_PORT"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      mr_tail "$MR_STATE/rabbit.out" "$r"/log/*.log
      mr_log "RabbitMQ node exited during startup (see log above)"; return 1
    fi
    if ((SECONDS > deadline)); then
      mr_tail "$MR_STATE/rabbit.out" "$r"/log/*.log
      mr_log "RabbitMQ did not answer the AMQP handshake on 127.0.0.1:$MR_AMQP_PORT within ${MR_START_TIMEOUT}s"; return 1
    fi
    sleep 0.5
  done
  MR_AMQP_URL="amqp://guest:guest@127.0.0.1:$MR_AMQP_PORT/%2f"
  MR_AMQPS_URL=""
  if [[ -n "${MR_AMQPS_PORT:-}" ]]; then
    until mr_port_busy "$MR_AMQPS_PORT"; do
      if ((SECONDS > deadline)); then
        mr_tail "$r"/log/*.log
        mr_log "RabbitMQ's TLS listener is not up on 127.0.0.1:$MR_AMQPS_PORT within ${MR_START_TIMEOUT}s"; return 1
      fi
      sleep 0.2
    done
    # localhost: a name server.pem carries (guest logs in from loopback only).
    MR_AMQPS_URL="amqps://guest:guest@localhost:$MR_AMQPS_PORT/%2f"
  fi
  mr_log "RabbitMQ: ready ($MR_AMQP_URL${MR_AMQPS_URL:+, $MR_AMQPS_URL}) in $(mr_since "$start")"
}

mr_rabbit_start_once() {
  mr_rabbit_configure && mr_rabbit_launch
}

mr_rabbit_start() {
  # A second try (new ports, new node name) covers losing a race for one of
  # the three ports to another process; a real failure fails twice.
  local attempt
  for attempt in 1 2; do
    mr_rabbit_start_once && return 0
    mr_rabbit_stop || true
    ((attempt == 1)) && mr_log "RabbitMQ: retrying with other ports"
  done
  mr_die "RabbitMQ failed to start (logs above; state in $MR_STATE)"
}

# True if process group $1 has a live (non-zombie) member. Zombies count as
# gone: once the servers are orphaned, reaping is up to PID 1.
mr_group_alive() {
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

mr_kill_group() {
  # $1 pid/pgid file, $2 label, $3 signal (TERM). Signal the group, wait up
  # to 20 s, then KILL.
  local f="$1" label="$2" sig="${3:-TERM}" pg i
  [[ -f "$f" ]] || return 0
  pg="$(cat "$f")"
  [[ -n "$pg" ]] || return 0
  if mr_group_alive "$pg"; then
    mr_log "$label: stopping"
    kill -"$sig" -- "-$pg" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
      mr_group_alive "$pg" || break
      sleep 0.1
    done
    if mr_group_alive "$pg"; then
      mr_log "$label: did not stop in 20s, killing"
      kill -KILL -- "-$pg" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

mr_rabbit_stop() {
  # beam.smp turns SIGTERM into a clean shutdown (Erlang >= 23).
  mr_kill_group "$MR_STATE/rabbit.pgid" "RabbitMQ"
  # epmd keeps no state, and under runuser a TERM costs a 2 s grace period.
  mr_kill_group "$MR_STATE/epmd.pid" "epmd" KILL
}

# ---------------------------------------------------------------- all ------

mr_write_env() {
  {
    echo "export MAILROOM_TEST_POSTGRES_URL='$MR_PG_URL'"
    echo "export MAILROOM_TEST_POSTGRES_TLS_URL='$MR_PG_TLS_URL'"
    echo "export MAILROOM_TEST_AMQP_URL='$MR_AMQP_URL'"
    echo "export MAILROOM_TEST_TLS_DIR='$MR_TLS_DIR'"
    echo "export MAILROOM_TEST_AMQPS_URL='$MR_AMQPS_URL'"
    echo "export MAILROOM_TEST_PGBOUNCER_URL='$MR_PGBOUNCER_URL'"
  } >"$MR_STATE/env"
}

mr_services_up() {
  # $1: state dir. Sets MR_PG_URL, MR_AMQP_URL and writes $1/env.
  mr_ensure_packages   # first: it creates the postgres/rabbitmq users
  mr_state_init "$1"
  mr_tls_certs
  mr_pg_start
  mr_pg_tls_start
  mr_pgbouncer_start
  mr_rabbit_start
  mr_write_env
}

mr_services_down() {
  # $1: state dir. Safe to call twice, or on a half-started state.
  MR_STATE="$1"
  [[ -n "$MR_STATE" && -d "$MR_STATE" ]] || return 0
  mr_rabbit_stop || true
  mr_pgbouncer_stop || true
  mr_pg_stop || true
  mr_pg_stop pgtls || true
  rm -rf -- "$MR_STATE"
}

#!/usr/bin/env bash
# A replicated TideMQ cluster on one machine: one name server and two broker groups (broker-a,
# broker-b), each a master and a slave, as five background processes.
#
#   scripts/cluster-2x2.sh start DIR     write DIR/conf/*.conf (first time), start, wait until
#                                        every broker is listed by the name server
#   scripts/cluster-2x2.sh stop DIR      SIGTERM every process (slaves, masters, name server)
#   scripts/cluster-2x2.sh status DIR    which processes run
#
# Under DIR: conf/<name>.conf (RocketMQ-style broker.conf, edit and restart to change), data/<name>/
# (stores), logs/<name>.log, pids/<name>.pid. The conf files are written once, with one random
# haSecret shared by the four brokers (the files are mode 600); a restart reuses them.
#
# Environment:
#   TIDEMQ            the tidemq command (default: tidemq on PATH, else .venv/bin/tidemq here)
#   NAMESRV_PORT      name server port (default 9876)
#   BROKER_PORT_BASE  broker-a master port; the slave is +10, broker-b's master +20 and its slave
#                     +30 (default 10911: 10911, 10921, 10931, 10941). Each broker also uses
#                     port-2 (VIP) and port+1 (a master's HA listener).
#   MASTER_ROLE       SYNC_MASTER (default: a send is answered once the slave has it) or
#                     ASYNC_MASTER (answered after the master's own write)
set -euo pipefail

NAMESRV_PORT=${NAMESRV_PORT:-9876}
BROKER_PORT_BASE=${BROKER_PORT_BASE:-10911}
MASTER_ROLE=${MASTER_ROLE:-SYNC_MASTER}
# How long a process may take to accept connections, then to exit after SIGTERM (seconds).
START_TIMEOUT_S=30
# How long the four brokers may take to be listed by the name server once they listen (seconds).
REGISTER_TIMEOUT_S=30
STOP_TIMEOUT_S=20
# Name server first, slaves last when starting; the reverse when stopping.
NAMES=(namesrv broker-a-0 broker-b-0 broker-a-1 broker-b-1)

usage() {
    echo "usage: $0 start|stop|status DIR" >&2
    exit 2
}

tidemq_command() {
    if [[ -n "${TIDEMQ:-}" ]]; then
        echo "$TIDEMQ"
    elif command -v tidemq >/dev/null 2>&1; then
        command -v tidemq
    else
        local here
        here=$(cd "$(dirname "$0")/.." && pwd)
        [[ -x "$here/.venv/bin/tidemq" ]] || { echo "tidemq not found: set TIDEMQ" >&2; exit 1; }
        echo "$here/.venv/bin/tidemq"
    fi
}

# broker-a-0 → its listen port.
broker_port() {
    local group=${1:7:1} id=${1:9:1} offset=0
    [[ $group == b ]] && offset=20
    echo $((BROKER_PORT_BASE + offset + 10 * id))
}

write_conf() {
    local dir=$1 name=$2 secret=$3
    local group=${name%-*} id=${name##*-} role=$MASTER_ROLE
    [[ $id == 0 ]] || role=SLAVE
    cat >"$dir/conf/$name.conf" <<EOF
# $name: written by scripts/cluster-2x2.sh; edit and restart to change.
brokerClusterName=DefaultCluster
brokerName=$group
brokerId=$id
brokerRole=$role
namesrvAddr=127.0.0.1:$NAMESRV_PORT
brokerIP1=127.0.0.1
listenPort=$(broker_port "$name")
storePathRootDir=$dir/data/$name
haSecret=$secret
EOF
    chmod 600 "$dir/conf/$name.conf"
}

write_confs() {
    local dir=$1 secret name
    [[ -f "$dir/conf/broker-a-0.conf" ]] && return 0
    mkdir -p "$dir/conf"
    secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    for name in "${NAMES[@]:1}"; do
        write_conf "$dir" "$name" "$secret"
    done
}

running() {
    local pidfile=$1/pids/$2.pid
    [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

wait_port() {
    local name=$1 port=$2 log=$3 waited=0
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ((waited >= START_TIMEOUT_S * 10)); then
            echo "$name did not accept on port $port within ${START_TIMEOUT_S} s; see $log" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

start_one() {
    local dir=$1 name=$2 tidemq=$3 port log=$1/logs/$2.log
    if running "$dir" "$name"; then
        echo "$name already running (pid $(cat "$dir/pids/$name.pid"))"
        return 0
    fi
    if [[ $name == namesrv ]]; then
        port=$NAMESRV_PORT
        nohup "$tidemq" namesrv --port "$port" --data-dir "$dir/data/namesrv" >>"$log" 2>&1 &
    else
        port=$(broker_port "$name")
        nohup "$tidemq" broker -c "$dir/conf/$name.conf" >>"$log" 2>&1 &
    fi
    echo $! >"$dir/pids/$name.pid"
    wait_port "$name" "$port" "$log"
    echo "$name started: 127.0.0.1:$port (pid $(cat "$dir/pids/$name.pid"))"
}

# The brokers the name server does not list yet (by listen port), as names on one line.
unlisted() {
    local tidemq=$1 listed name missing=()
    # cluster list's ADDRESS column; nothing while the name server does not answer.
    listed=$("$tidemq" cluster list -n "127.0.0.1:$NAMESRV_PORT" 2>/dev/null |
        awk 'NR > 1 { print $5 }') || listed=""
    for name in "${NAMES[@]:1}"; do
        grep -qxF "127.0.0.1:$(broker_port "$name")" <<<"$listed" || missing+=("$name")
    done
    echo "${missing[*]}"
}

# A broker registers with the name server just after it listens: until then a client (`tidemq
# topic create` right after start) does not see it. Wait until every broker is listed.
wait_registered() {
    local dir=$1 tidemq=$2 missing deadline=$((SECONDS + REGISTER_TIMEOUT_S))
    while missing=$(unlisted "$tidemq") && [[ -n $missing ]]; do
        if ((SECONDS >= deadline)); then
            echo "not listed by the name server 127.0.0.1:$NAMESRV_PORT within" \
                "${REGISTER_TIMEOUT_S} s: $missing; see $dir/logs/" >&2
            exit 1
        fi
        sleep 0.2
    done
}

start() {
    local dir=$1 tidemq name
    tidemq=$(tidemq_command)
    mkdir -p "$dir/logs" "$dir/pids" "$dir/data"
    write_confs "$dir"
    for name in "${NAMES[@]}"; do
        start_one "$dir" "$name" "$tidemq"
    done
    wait_registered "$dir" "$tidemq"
    echo "cluster up; try: $tidemq cluster list -n 127.0.0.1:$NAMESRV_PORT"
}

stop_one() {
    local dir=$1 name=$2 pid waited=0
    running "$dir" "$name" || { rm -f "$dir/pids/$name.pid"; return 0; }
    pid=$(cat "$dir/pids/$name.pid")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= STOP_TIMEOUT_S * 10)); then
            echo "$name (pid $pid) did not stop within ${STOP_TIMEOUT_S} s; killing it" >&2
            kill -KILL "$pid"
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rm -f "$dir/pids/$name.pid"
    echo "$name stopped"
}

stop() {
    local dir=$1 i
    for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do
        stop_one "$dir" "${NAMES[i]}"
    done
}

status() {
    local dir=$1 name
    for name in "${NAMES[@]}"; do
        if running "$dir" "$name"; then
            echo "$name running (pid $(cat "$dir/pids/$name.pid"))"
        else
            echo "$name stopped"
        fi
    done
}

[[ $# -eq 2 ]] || usage
command=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
case $command in
start) start "$dir" ;;
stop) stop "$dir" ;;
status) status "$dir" ;;
*) usage ;;
esac

#!/bin/sh
# Profile the broker under one load shape from a separate client process.
#   PROFILER=cprofile (default): $OUT/broker.prof;  PROFILER=py-spy: $OUT/broker.txt (collapsed);
#   PROFILER=none: no profiler; prints the broker's CPU seconds (user+sys) for the run.
# Usage: benchmarks/profile/run.sh SHAPE COUNT [FLUSH] [CLIENT_PROF]
set -e
shape=${1:-pipelined}; count=${2:-20000}; flush=${3:-ASYNC_FLUSH}; client_prof=$4
py=${PY:-.venv/bin/python}
out=${OUT:-/tmp/tidemq-profile}
mkdir -p "$out"; rm -rf "$out/data"
port() { $py -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
np=$(port); bp=$(port)
dev="-m tidemq.cli.main --log-level WARNING dev --namesrv-port $np --broker-port $bp"
dev="$dev --data-dir $out/data --set flushDiskType=$flush"
# BROKER_SRC: run the broker from another source tree (A/B against a baseline checkout).
[ -n "$BROKER_SRC" ] && export PYTHONPATH="$BROKER_SRC"
# CLIENT_SRC: the same for the load generator (the client library).
case "${PROFILER:-cprofile}" in
  py-spy) .venv/bin/py-spy record -r 200 -f raw -o "$out/broker.txt" -- $py $dev >/dev/null 2>&1 &;;
  none) $py $dev &;;
  *) $py -m cProfile -o "$out/broker.prof" $dev &;;
esac
pid=$!
while ! $py -c "import socket;socket.create_connection(('127.0.0.1',$bp),0.2)" 2>/dev/null; do
  sleep 0.1
done
target=$pid
[ "${PROFILER:-cprofile}" = py-spy ] && target=$(pgrep -P $pid | head -1)
unset PYTHONPATH
cpu0=$(awk '{print $14+$15}' /proc/$target/stat)
PYTHONPATH=$CLIENT_SRC $py benchmarks/profile/load.py 127.0.0.1:$np "$shape" "$count" ${client_prof:+--profile "$client_prof"}
cpu1=$(awk '{print $14+$15}' /proc/$target/stat)
echo "broker CPU $(( (cpu1 - cpu0) * 1000000 / $(getconf CLK_TCK) / count )) µs/msg"
kill -TERM $target 2>/dev/null || true
wait $pid || true

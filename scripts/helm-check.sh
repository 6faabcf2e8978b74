#!/usr/bin/env bash
# Lints and renders the chart with the real helm, where helm is installed (CI checks the
# objects scripts/helm-golden.sh rendered, in tests/suite/helm_chart.rs). Usage: scripts/helm-check.sh [values.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v helm >/dev/null || { echo "helm is not installed" >&2; exit 2; }
chart=deploy/helm/compactor
extra=()
[ $# -gt 0 ] && extra=(-f "$1")
helm lint "$chart" "${extra[@]}"
helm template prod "$chart" "${extra[@]}"
helm template prod "$chart" --set autoscaling.enabled=true --set serviceMonitor.enabled=true \
  --set existingSecret=llm-keys "${extra[@]}" >/dev/null

#!/usr/bin/env bash
# The main job on the embedded local cluster: `orchestrate run ARM` (default diloco-four, cpu profile).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
exec orchestrate run "${1:-diloco-four}" --profile "${PROFILE:-cpu}" "${@:2}"

#!/usr/bin/env bash
# Install everything the tests need, then run them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
exec python -m pytest "${@:-tests}"

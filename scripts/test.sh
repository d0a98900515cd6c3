#!/usr/bin/env bash
# Install everything the tests need, then run them.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
# The SSH and network-namespace tests need a real sshd, iproute2 and iptables (and root); the AWS loop runs one
# command with its clock moved past the deadline (faketime). As root, install them if missing; otherwise those
# tests skip and say why.
if [ "$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || ! command -v ip >/dev/null || ! command -v iptables >/dev/null \
                           || ! command -v faketime >/dev/null; }; then
  echo "[test] installing openssh-server iproute2 iptables faketime"
  (apt-get install -y -q openssh-server iproute2 iptables faketime >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q openssh-server iproute2 iptables faketime >/dev/null; })
fi
bash scripts/bootstrap.sh
. .venv/bin/activate
# The set-up is timed apart from the tests (pytest's last line gives theirs): on a fresh machine it is
# mostly installing torch, and it says nothing about the suite's own speed.
echo "[test] set-up took ${SECONDS} s (system packages, .venv); the tests' own time is pytest's last line"
# Three workers on the machines' two cores: many tests wait (on ranks' paced updates, a cut-off controller,
# sshd), and a third worker's tests fill the CPU they leave (bench/results/2026-12-04-three-workers-2cpu/).
# tests/conftest.py's GROUPS keeps a module's namespace-host tests on one of them, each worker's hosts in a
# slot of their own, the finished trial's tests on one, and a module's tests that share a fixture it builds;
# TEST_WORKERS=0 runs everything in this one process.
exec python -m pytest -n "${TEST_WORKERS:-3}" --dist loadgroup "${@:-tests}"

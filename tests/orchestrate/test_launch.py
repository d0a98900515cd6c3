"""The launch layer (orchestrate/launch/): a rank's command and environment are built once, the same
for this machine and an SSH host but for what the policy says differs; the reasons a group fails
are the strings the evidence records; and no other module of the controller sets a rank's
environment, so changing it is a change to command.py alone. The environment each spawner really
hands a rank is compared in test_remote.py (it needs SSH hosts); the spawners run for real in
test_checkpoints.py and test_guard.py (local) and test_remote.py (SSH)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from conftest import ROOT
from evidence.canonical import canonical_bytes, json_bytes
from orchestrate.cluster import Host
from orchestrate.launch.command import (Rendezvous, Site, host_command, local_argv, process_env, serve_argv,
                                        train_argv)
from orchestrate.launch.supervise import GroupResult, Reason

HOST = Host(rank=1, name="h1", transport="ssh", address="10.0.0.2", private_address="10.1.0.2", root="/srv/trial",
            interface="ens5", python="/opt/py/bin/python3")
SAME_PATHS = Site.here(Path("/srv/trial/home"), Path("/srv/trial/seed"))  # this machine, the host's layout

POLICY = ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "LOCAL_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
          "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def test_a_rank_gets_the_same_command_here_and_on_a_host():
    assert Site.on(HOST) == SAME_PATHS
    here = train_argv(SAME_PATHS, "clean-pair", 3, ["--resume"])
    assert here == train_argv(Site.on(HOST), "clean-pair", 3, ["--resume"]) == [
        "-m", "training", "train", "--home", "/srv/trial/home", "--arm", "clean-pair", "--model-dir",
        "/srv/trial/seed", "--threads", "3", "--resume"]
    assert local_argv(here) == [sys.executable, *here]
    assert host_command(HOST, here) == ("cd /srv/trial && PYTHONPATH=/srv/trial/site exec /opt/py/bin/python3 -P "
                                        + " ".join(here))
    serve = serve_argv(Site.on(HOST), "replica-1.h1", "10.1.0.2", "/srv/trial/r.json", threads=None, arm="a")
    assert "--threads" not in serve and serve[serve.index("--model-dir") + 1] == "/srv/trial/seed"


def test_a_rank_gets_the_same_environment_here_and_on_a_host_but_its_device_and_address():
    group = Rendezvous(2, "10.1.0.1", 29500)
    here = process_env(1, here=True, threads=4, inherited={"TRIAL_X": "1"}, group=group)
    there = process_env(1, here=False, threads=4, inherited={"TRIAL_X": "1"}, group=group)
    assert here == {**there, "LOCAL_RANK": "1"} and there["LOCAL_RANK"] == "0"  # ranks here share the GPUs
    assert there == {"TRIAL_X": "1", "OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1", "LOCAL_RANK": "0",
                     "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.1.0.1", "MASTER_PORT": "29500"}
    on_nic = process_env(1, here=False, threads=None, group=Rendezvous(2, "10.1.0.1", 29500, "ens5"))
    assert on_nic["GLOO_SOCKET_IFNAME"] == on_nic["NCCL_SOCKET_IFNAME"] == "ens5" and "OMP_NUM_THREADS" not in on_nic
    # an operator's (or a caller's) OMP_NUM_THREADS wins over the split of the cores
    assert process_env(0, here=True, threads=4, inherited={"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"
    # a serving replica: no rendezvous
    assert not set(process_env(0, here=True, threads=1)) & {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}


def test_a_reason_is_recorded_as_the_string_it_always_was():
    assert {r.value for r in Reason} == {"exit", "heartbeat", "unreachable", "lost", "guard"}
    record = {"observed_rank": 1, "reason": Reason.UNREACHABLE}  # as recovery.py writes its failure
    assert json_bytes(record) == json_bytes({"observed_rank": 1, "reason": "unreachable"})
    assert canonical_bytes(record) == canonical_bytes({"observed_rank": 1, "reason": "unreachable"})
    assert f"{Reason.LOST}" == "lost" and json.dumps(Reason.GUARD) == '"guard"'
    res = GroupResult(codes=[1, 0], logs=[], seconds=0.0, first_failure=0, reason="exit")  # a stored string
    assert res.reason is Reason.EXIT


def test_no_other_controller_module_sets_a_ranks_environment():
    """The policy's variables are named in orchestrate/launch/command.py only: a module that builds
    a rank's environment itself (a dict key, a keyword, a subscript) is named here."""
    home = ROOT / "orchestrate"
    found = []
    for path in sorted(home.rglob("*.py")):
        if path == home / "launch" / "command.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = node.value if isinstance(node, ast.Constant) else node.arg if isinstance(node, ast.keyword) else None
            if named in POLICY:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {named}")
    assert found == []

"""`orchestrate plan` (cost, hours and bytes per arm against the budget; vCPUs against the quota) and
`orchestrate status` (rank states from the hosts, spend from AWS Budgets on moto's server)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import example_stack, proc_state, run_cli
from orchestrate.cli import app
from orchestrate.cluster import local_cluster, save
from orchestrate.status import trial_status

ACCOUNT = "123456789012"


def test_vcpu_quota_is_read_from_service_quotas():
    import boto3
    from botocore.stub import Stubber

    from orchestrate.cloud import read_vcpu_quota

    client = boto3.client("service-quotas", region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    with Stubber(client) as st:
        st.add_response("get_service_quota", {"Quota": {"QuotaCode": "L-DB2E81BA", "Value": 64.0}},
                        {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"})

        class Session:  # hands out the stubbed client
            def client(self, name):
                assert name == "service-quotas"
                return client

        assert read_vcpu_quota(Session()) == 64.0


def test_plan_says_when_the_quota_cannot_be_read(aws, tmp_path):
    assert aws.client("sts").get_caller_identity()["Account"] == ACCOUNT
    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(example_stack(tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["zones"]["checked"] and got["zones"]["zones"] == {"us-east-1c": ["g6e.xlarge"], "us-east-1d": ["g6e.xlarge"]}
    assert [t["arm"] for t in got["traffic"]] == ["single", "ddp-four", "diloco-four"]
    assert got["vcpu"]["hosts_vcpus"] == 16 and got["vcpu"]["quota"] is None
    assert "quota not readable" in got["vcpu"]["note"]  # moto has no EC2 quotas: said, not guessed
    assert got["total_usd"] == pytest.approx(83.96, abs=0.01) and got["problems"] == []  # with stopped volumes, IPv4


def test_plan_refuses_over_the_quota(monkeypatch, tmp_path):
    stack = str(example_stack(tmp_path))
    monkeypatch.setattr("orchestrate.stages.plan.read_vcpu_quota", lambda session: 8.0)  # where plan calls it
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack])
    assert r.exit_code == 1
    out = " ".join(r.output.split())
    assert "the hosts need 16 G/VT vCPUs; the account's quota in us-east-1 is 8" in out
    assert "ddp-four" in out and "52.57" in out  # the arm's transfer cost, in its row
    assert "late backstop: AWS Budgets sees costs hours late" in out and "transfer guards are the bounds" in out
    # through the bucket one copy of the 1.7B model's 6.85 GB seed leaves this machine (0.15 h at 100 Mbit/s);
    # over SSH alone, four copies would (0.61 h)
    seed = "(6.85 GB seed, 4 bytes × 1,711,376,384 parameters + 0.00 GB wheelhouse (not given: --wheelhouse))"
    assert (f"staging through the trial's bucket (what `orchestrate run` does on this stack): {seed} once + the "
            "project's wheel to each of 4 host(s) = 6.85 GB leave this machine: 0.15 h at 100 Mbit/s") in out
    assert f"staging over SSH alone (no bucket): 4 host(s) × {seed} = 27.38 GB: 0.61 h at 100 Mbit/s" in out
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack, "--no-quota", "--uplink-mbps", "10"])
    assert "more than the 3 h paid for" not in r.output  # 1.52 h through the bucket (6.08 h over SSH alone)
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack, "--no-quota", "--uplink-mbps", "4"])
    assert r.exit_code == 1 and "even through the bucket: 3.81 h at 4 Mbit/s, more than the 3 h paid for" in \
        " ".join(r.output.split())
    for bad in (["--uplink-mbps", "0"], ["--wheelhouse", str(tmp_path / "none")]):
        r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack, "--no-quota", *bad])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    # the stack names what it runs (its experiment at its profile): a plan of anything else is refused by name
    r = CliRunner().invoke(app, ["plan", "clean-pair", "--stack", stack, "--no-quota"])
    assert r.exit_code == 2 and ("runs local-training-windows at profile gpu; this plan is of cooperative-learning at "
                                 "profile gpu") in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack, "--no-quota", "--profile", "smoke"])
    assert r.exit_code == 2 and "this plan is of local-training-windows at profile smoke" in " ".join(r.output.split())
    # a profile that replaces an arm's own setting: the plan prices it as it runs and says so (#33)
    (tmp_path / "smoke").mkdir()
    smoke = example_stack(tmp_path / "smoke", profile="smoke")
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(smoke), "--no-quota", "--profile", "smoke"])
    assert "diloco-four: sync_every = 4 (profile smoke; the arm's own: 16)" in r.output, r.output
    diloco = next(x for x in json.loads(CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(smoke),
                  "--no-quota", "--profile", "smoke", "--json"]).output)["traffic"] if x["arm"] == "diloco-four")
    assert diloco["synchronizations"] == 16 // 4


def test_status_of_the_embedded_cluster(trained, aws, tmp_path, zombie):
    """A finished 2-rank arm, a rank whose process is alive, then one whose process has exited but
    is not reaped (a zombie: stopped, not running), and the trial's budget read from moto."""
    import shutil

    trained = shutil.copytree(trained, tmp_path / "home")  # the session's fixture stays as it was
    aws.client("budgets").create_budget(AccountId=ACCOUNT, Budget={
        "BudgetName": "st-budget", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"},
        "TimeUnit": "ANNUALLY", "BudgetType": "COST"})
    deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    c = local_cluster(2, tmp_path, "file:///unused").model_copy(update={
        "budget_name": "st-budget", "region": "us-east-1", "deadline": deadline, "trial": "st"})
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # rank 1 of a made-up arm is 'running': its heartbeat names a live pid
        beat = trained / "runs" / "zz-live" / "rank-1" / "heartbeat.json"
        beat.parent.mkdir(parents=True)
        beat.write_text(json.dumps({"pid": live.pid, "time": 0, "update": 3}))
        st = trial_status(c, trained, session=aws)
        beat.write_text(json.dumps({"pid": zombie, "time": 0, "update": 4}))
        st_zombie = trial_status(c, trained, session=aws)
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.wait()
    assert (st_zombie.hosts[1].state, st_zombie.hosts[1].update) == ("stopped", 4)
    assert proc_state(zombie) == "Z"  # still a zombie when status looked
    h0, h1 = st.hosts
    assert (h0.state, h0.arm, h0.update) == ("finished", "clean-pair", 16)
    assert h0.reachable and h0.bytes_rx_tx is not None
    assert (h1.state, h1.arm, h1.update) == ("running", "zz-live", 3)
    assert 7000 < st.seconds_to_deadline <= 7200
    assert st.spend.name == "st-budget" and st.spend.limit_usd == 100.0
    save(c, tmp_path / "cluster.json")
    r = run_cli("-m", "orchestrate", "status", "--cluster", str(tmp_path / "cluster.json"), "--home", str(trained))
    out = " ".join(r.stderr.split())
    assert r.returncode == 0 and "of $100.00" in out and "min left" in out and "finished" in out, r.stderr
    r = run_cli("-m", "orchestrate", "status", "--cluster", str(tmp_path / "cluster.json"))
    assert r.returncode == 2 and "pass --home" in r.stderr


def test_a_spent_budget_starts_nothing(aws, tmp_path):
    aws.client("budgets").create_budget(AccountId=ACCOUNT, Budget={
        "BudgetName": "spent-budget", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"},
        "TimeUnit": "ANNUALLY", "BudgetType": "COST",
        "CalculatedSpend": {"ActualSpend": {"Amount": "100.5", "Unit": "USD"},
                            "ForecastedSpend": {"Amount": "130", "Unit": "USD"}}})
    c = local_cluster(4, tmp_path, "file:///unused").model_copy(update={
        "budget_name": "spent-budget", "region": "us-east-1"})
    save(c, tmp_path / "cluster.json")
    r = run_cli("-m", "orchestrate", "run", "diloco-four", "--profile", "smoke", "--trials", str(tmp_path / "t"),
                "--cluster", str(tmp_path / "cluster.json"))
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "is spent ($100.50 of $100.00); nothing starts" in said
    # the figure is not presented as current: its age, and what bounds the trial instead
    assert "last updated" in said and "lags the spend by hours" in said and "the deadline and the transfer guards" in said
    assert not (tmp_path / "t").exists()  # refused before anything was prepared


def test_plan_shows_which_arms_the_hosts_gpus_fit(tmp_path, monkeypatch):
    """One rank per host on its GPU: with a GPU-less host among four, the four-rank arms are listed as
    not run (and `run` would train the others); the plan itself still fits. An instance type whose
    GPU count is not known says so."""
    import yaml

    import infra.prices

    monkeypatch.setitem(infra.prices.INSTANCE_TYPES, "c7i.xlarge", {"vcpus": 4, "gpus": 0, "ebs_baseline_mb_s": None})
    stack = yaml.safe_load(example_stack(tmp_path).read_text())
    conf = stack["config"]["trials:cluster"]
    conf["hosts"][3]["instance_type"] = "c7i.xlarge"
    conf["prices"] = {"instance/c7i.xlarge": 0.2, "instance/x9.unknown": 1.0}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(stack))
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(tmp_path / "s.yaml"), "--no-quota", "--json"])
    assert r.exit_code == 0, r.output
    placed = json.loads(r.stdout)["placement"]
    assert placed["cluster"]["gpus_per_host"] == [1, 1, 1, 0]
    assert {a["arm"]: a["reason"] for a in placed["arms"]} == {
        "single": None, "ddp-four": "not run: needs 4 GPUs, the cluster has 3",
        "diloco-four": "not run: needs 4 GPUs, the cluster has 3"}
    # what each gate can reach at the gpu profile, before anything is spent: H = 16 in 128 updates
    # gives DiLoCo 1/16 of DDP's bytes, so the 1/8 gate can pass; McNemar needs 7 of 1,024 cases
    gates = {g["gate"]: g for g in json.loads(r.stdout)["attainability"]["gates"]}
    assert gates["bytes ≤ 0.125 × ddp-four"]["attainable"] is True
    assert gates["bytes ≤ 0.125 × ddp-four"]["figures"]["ratio"] == 0.0625
    assert gates["McNemar p ≤ 0.01"]["figures"]["min_discordant"] == 7
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(tmp_path / "s.yaml"), "--no-quota"])
    assert r.exit_code == 0 and "not run: needs 4 GPUs, the cluster has 3" in " ".join(r.output.split())
    assert ("local-training-windows: gates at profile gpu (1024 test cases): 5 attainable, 0 unattainable at this profile, 1 decided by "
            "measurement") in " ".join(r.output.split())
    conf["hosts"][0]["instance_type"] = "x9.unknown"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(stack))
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(tmp_path / "s.yaml"), "--no-quota", "--json"])
    arms = {a["arm"]: a for a in json.loads(r.stdout)["placement"]["arms"]}
    assert arms["single"]["runs"] and not arms["single"]["gpus_known"]


def test_plan_checks_the_zones_offer_the_type(aws, tmp_path, capsys):
    """Zone names map to different physical zones per account; a zone may lack g6e. `plan` asks EC2 (here
    moto, whose us-east-1 offers g6e in use1-az1/2/4/6 only) by zone ID and names the zone that lacks it;
    offline it says the zones were not checked."""
    assert aws.client("ec2").describe_availability_zones()["AvailabilityZones"]
    ids = ["use1-az2"] * 3 + ["use1-az3"]
    stack = str(example_stack(tmp_path, hosts=[{"rank": r, "instance_type": "g6e.xlarge", "zone": z}
                                               for r, z in enumerate(ids)]))
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", stack])
    out = " ".join(r.output.split())
    assert r.exit_code == 1, out
    assert ("host 3's zone use1-az3 does not offer g6e.xlarge in this account (offered in: use1-az1, use1-az2, "
            "use1-az4, use1-az6 of us-east-1)") in out
    assert "zones: use1-az2 offers g6e.xlarge; use1-az3 offers none of the types" in out
    # the example stack, as `plan` shows it with AWS reachable: zones checked, the guard, stopped volumes
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(example_stack(tmp_path))])
    with capsys.disabled():
        print("\n--- orchestrate plan diloco-four (example stack, moto) ---\n" + r.output)
    out = " ".join(r.output.split())
    assert r.exit_code == 0, out
    assert "zones: us-east-1c (use1-az2 in this account) offers g6e.xlarge; us-east-1d (use1-az4 in this account)" in out
    assert "the controller stops a group at 95% (guard_fraction, the same number on the hosts)" in out
    assert "stopped volumes: $4.05 a day after the deadline until `orchestrate down` (1 d counted" in out
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(example_stack(tmp_path)), "--no-quota"])
    assert "zones: not checked (--no-quota: no AWS reads)" in " ".join(r.output.split())


def test_budget_spend_is_said_with_its_age(aws):
    from orchestrate.cloud import budget_note, read_budget

    aws.client("budgets").create_budget(AccountId=ACCOUNT, Budget={
        "BudgetName": "aged", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"}, "TimeUnit": "ANNUALLY",
        "BudgetType": "COST"})
    b = read_budget(aws, ACCOUNT, "aged")
    assert b.updated_at  # moto, like AWS, says when the budget's figures were last updated
    t = dt.datetime.fromisoformat(b.updated_at)
    note = budget_note(b, now=t + dt.timedelta(hours=5))
    assert note.startswith("$0.00 of $100.00 (forecast $0.00), last updated") and "(5.0 h ago)" in note
    assert "lags the spend by hours" in note and "the deadline and the transfer guards bound the trial" in note

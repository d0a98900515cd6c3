"""The first log-in to a stack's hosts, with no hand work and no blind trust: the operator's public key
checked before the stack creates anything (a private key pasted by mistake refused by name), the
hosts' keys pinned from what cloud-init printed on each console (real-format text: noise around the
block, a boot still printing, two boots), `orchestrate up` reading the consoles through boto3 (moto's
server: a console with no keys is waited for, then refused naming the instance), and a cluster pinned
that way logging in to real sshd hosts — and refusing a host whose key is not the printed one."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from conftest import run_cli
from infra.keys import SSHKeyError, host_key_blocks, operator_public_key, pinned_host_key
from infra.outputs import OUTPUTS_FORMAT
from orchestrate.cloud import HostKeysMissing, console_output, pin_host_keys, trial_instances


def pub(key) -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


ED, ECDSA, RSA = (pub(ed25519.Ed25519PrivateKey.generate()), pub(ec.generate_private_key(ec.SECP256R1())),
                  pub(rsa.generate_private_key(public_exponent=65537, key_size=2048)))


def console(*keys: str, host: str = "ip-10-42-0-5", tail: bool = True) -> str:
    """What an Ubuntu instance's console shows around cloud-init's key block (the shape seen on EC2:
    syslog-prefixed fingerprints, then the keys unprefixed, kernel and cloud-init lines around)."""
    lines = ["[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-092) #23~22.04.1-Ubuntu SMP",
             "[   12.104311] cloud-init[1092]: Cloud-init v. 24.4.1-0ubuntu0~22.04.1 running 'modules:final'",
             "<14>Dec  1 20:00:01 ec2: ",
             "<14>Dec  1 20:00:01 ec2: #############################################################",
             "<14>Dec  1 20:00:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
             f"<14>Dec  1 20:00:01 ec2: 256 SHA256:3dhQ6ZcA0uZsXy8wq1Ek root@{host} (ED25519)",
             "<14>Dec  1 20:00:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----",
             "<14>Dec  1 20:00:01 ec2: #############################################################",
             "-----BEGIN SSH HOST KEY KEYS-----", *(f"{k} root@{host}" for k in keys)]
    if tail:
        lines += ["-----END SSH HOST KEY KEYS-----",
                  "[   12.530012] cloud-init[1092]: Cloud-init v. 24.4.1 finished at Tue, 01 Dec 2026 20:00:01 +0000."]
    return "\r\n".join(lines) + "\r\n"


def test_the_operator_key_is_checked_before_anything_exists(tmp_path):
    assert operator_public_key(f"  {ED} me@laptop \n") == ED
    (tmp_path / "id.pub").write_text(f"{RSA} me@laptop\n")
    assert operator_public_key(str(tmp_path / "id.pub")) == RSA
    private = ed25519.Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.OpenSSH,
                                                                 NoEncryption()).decode()
    with pytest.raises(SSHKeyError, match="that is a private key: give the public half"):
        operator_public_key(private)
    (tmp_path / "id").write_text(private)
    with pytest.raises(SSHKeyError, match=rf"{tmp_path / 'id'} is a private key: give its public half \({tmp_path / 'id'}.pub\)"):
        operator_public_key(str(tmp_path / "id"))
    with pytest.raises(SSHKeyError, match="neither an OpenSSH public key nor a file"):
        operator_public_key(str(tmp_path / "missing.pub"))
    kind, blob = ED.split()
    with pytest.raises(SSHKeyError, match="the key says ssh-rsa but its data is a 'ssh-ed25519' key"):
        operator_public_key(f"ssh-rsa {blob}")
    with pytest.raises(SSHKeyError, match="base64 part is damaged"):
        operator_public_key(f"{kind} {blob[:-7]}")
    with pytest.raises(SSHKeyError, match="cut short"):  # whole base64 quads: it decodes, and loads with zeros
        operator_public_key(f"{kind} {blob[:44]}")
    with pytest.raises(SSHKeyError, match="starts with options"):
        operator_public_key(f'from="10.0.0.0/8",no-pty {ED}')
    with pytest.raises(SSHKeyError, match="EC2 key pairs are ed25519 or RSA; this is ecdsa-sha2-nistp256"):
        operator_public_key(ECDSA)
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = AKIASECRETSECRET\n")
    with pytest.raises(SSHKeyError) as e:
        operator_public_key(str(tmp_path / "credentials"))
    assert "AKIA" not in str(e.value) and str(tmp_path / "credentials") in str(e.value)


def test_the_stack_refuses_a_private_key_by_name(tmp_path):
    from conftest import example_stack

    private = tmp_path / "id_ed25519"
    private.write_text(ed25519.Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode())
    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--no-quota", "--stack",
                str(example_stack(tmp_path, ssh_public_key=str(private))))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and f"{private} is a private key: give its public half ({private}.pub)" in said, said
    assert "Traceback" not in said


def test_host_keys_are_read_from_real_format_console_text():
    assert pinned_host_key(console(ECDSA, ED, RSA), "rank 0") == ED  # ed25519 first, whatever the order
    assert pinned_host_key(console(RSA, ECDSA), "rank 0") == ECDSA
    p384 = pub(ec.generate_private_key(ec.SECP384R1()))  # pinned, and a cluster description takes it
    assert pinned_host_key(console(p384), "rank 0") == p384
    from orchestrate.cluster import Host
    assert Host(rank=0, name="h", transport="ssh", address="10.0.0.1", private_address="10.0.0.1", root="/opt/trial",
                host_key=p384).host_key == p384
    assert host_key_blocks(console(ECDSA, ED, RSA)) == [{k.split()[0]: k for k in (ECDSA, ED, RSA)}]
    booting = "[    0.000000] Linux version 6.8.0-1021-aws\r\n[    3.2] systemd[1]: Starting cloud-init...\r\n"
    assert pinned_host_key(booting, "rank 0") is None  # nothing printed yet
    assert pinned_host_key(console(ECDSA, ED, tail=False), "rank 0") is None  # the block is still printing
    assert pinned_host_key(console(ED) + console(ED, ECDSA), "rank 0") == ED  # a stop/start: the same keys
    other = pub(ed25519.Ed25519PrivateKey.generate())
    with pytest.raises(SSHKeyError, match="rank 0 printed 2 different ssh-ed25519 host keys"):
        pinned_host_key(console(ED) + console(other), "rank 0")
    damaged = console(ED.replace(ED.split()[1][10:14], "AAAA"))
    with pytest.raises(SSHKeyError, match="ssh-ed25519"):
        pinned_host_key(damaged, "rank 0")
    kind, blob = ED.split()  # a key line the console wrapped mid-key: refused, never pinned cut short
    with pytest.raises(SSHKeyError, match="cut short"):
        pinned_host_key(console(f"{kind} {blob[:44]}\r\n{blob[44:]}"), "rank 0")


def test_pinning_waits_for_a_booting_instance_then_refuses_by_name():
    calls: dict[str, int] = {"i-0aaaaaaaaaaaaaaa0": 0, "i-0bbbbbbbbbbbbbbb1": 0}

    def read(iid: str) -> str:  # rank 0 prints on its third read; rank 1 never does
        calls[iid] += 1
        return console(ED) if iid.startswith("i-0a") and calls[iid] >= 3 else "[    1.0] booting\r\n"

    said: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(HostKeysMissing, match=r"no SSH host keys on the console of rank 1 \(i-0bbbbbbbbbbbbbbb1\) "
                                              r"after 1 s"):
        pin_host_keys({0: "i-0aaaaaaaaaaaaaaa0", 1: "i-0bbbbbbbbbbbbbbb1"}, read, wait_s=1.0, poll_s=0.2,
                      say=said.append)
    assert 1.0 <= time.monotonic() - t0 < 5
    assert any("rank 0 (i-0aaaaaaaaaaaaaaa0): pinned ssh-ed25519" in m for m in said)
    assert calls["i-0aaaaaaaaaaaaaaa0"] == 3  # read until it printed, then no more
    assert pin_host_keys({0: "i-0aaaaaaaaaaaaaaa0"}, lambda i: console(ECDSA, ED), wait_s=0) == {0: ED}


def outputs(hosts: list[dict], trial: str = "keys-test") -> dict:
    return {"format": OUTPUTS_FORMAT, "trial": trial, "region": "us-east-1",
            "deadline": "2030-01-01T00:00:00+00:00", "hours": 3, "ssh_user": "root",
            "bucket": "trials-evidence-test", "prefix": f"trials/{trial}/", "alert_topic": "arn:aws:sns:x",
            "transfer_guard_bytes": 1e12, "isolated_ranks": [], "hosts": hosts}


def test_up_reads_the_consoles_through_boto3_and_refuses_a_silent_one(aws, tmp_path):
    ec2 = aws.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1)["Instances"][0]
           ["InstanceId"] for _ in range(2)]
    assert "Linux version" in console_output(aws, ids[0])  # moto's fixed console: a kernel, no keys
    out = tmp_path / "outputs.json"
    out.write_text(json.dumps(outputs([{"rank": r, "instance_id": i, "instance_type": "g6e.xlarge",
                                        "zone": "us-east-1c", "private_ip": f"10.42.0.{10 + r}"}
                                       for r, i in enumerate(ids)])))
    (tmp_path / "key").write_text("unused")
    r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
                "--boot-wait", "1", "--out", str(tmp_path / "cluster.json"))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2, said
    assert f"no SSH host keys on the console of rank 0 ({ids[0]}), rank 1 ({ids[1]}) after 1 s" in said
    assert not (tmp_path / "cluster.json").exists() and "Traceback" not in said
    # keys the operator checked some other way are pinned as given, and the consoles are not read
    (tmp_path / "keys.json").write_text(json.dumps({"0": ED, "1": ECDSA}))
    r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
                "--host-keys", str(tmp_path / "keys.json"), "--out", str(tmp_path / "cluster.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    pinned = json.loads((tmp_path / "cluster.json").read_text())["hosts"]
    assert [h["host_key"] for h in pinned] == [ED, ECDSA] and "console" not in r.stdout
    # after a stop/start the consoles print no keys (cloud-init's first boot only): `up` again keeps the
    # keys pinned for the same instances, and reads no console
    r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
                "--boot-wait", "1", "--out", str(tmp_path / "cluster.json"))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0 and "host keys kept from" in said and "reading" not in said, said
    assert [h["host_key"] for h in json.loads((tmp_path / "cluster.json").read_text())["hosts"]] == [ED, ECDSA]
    # a replaced host (another instance at rank 1) gets no kept key: its console is read, and refused
    new_id = ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    replaced = json.loads(out.read_text())
    replaced["hosts"][1]["instance_id"] = new_id
    out.write_text(json.dumps(replaced))
    r = run_cli("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
                "--boot-wait", "1", "--out", str(tmp_path / "cluster.json"))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and f"no SSH host keys on the console of rank 1 ({new_id})" in said, said


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                    reason="needs root and openssh-server (CI installs both)")
def test_a_cluster_pinned_from_the_consoles_logs_in_and_refuses_another_key(tmp_path):
    from orchestrate.cluster import pulumi_cluster
    from machinery.netns import PREFIX, NetnsHosts
    from orchestrate.transport import TransportError

    with NetnsHosts(2, tmp_path / "netns") as hs:
        ids = {h.index: f"i-0{h.index:016x}" for h in hs.hosts}
        consoles = {ids[h.index]: console(ECDSA, h.host_key, RSA, host=f"ip-{h.index}") for h in hs.hosts}
        keys = pin_host_keys(ids, consoles.__getitem__, wait_s=0)
        assert keys == {h.index: h.host_key for h in hs.hosts}
        desc = outputs([{"rank": h.index, "instance_id": ids[h.index], "instance_type": "g6e.xlarge",
                         "zone": "us-east-1c", "private_ip": h.address} for h in hs.hosts])
        cluster = pulumi_cluster(desc, key_file=str(hs.client_key), host_keys=keys, root=str(hs.hosts[0].root))
        for h in cluster.hosts:
            t = cluster.transport(h)
            try:
                r = t.run("ip -4 -o addr show eth0 | awk '{print $4}'")
                assert r.status == 0 and r.stdout.strip() == f"{h.address}/{PREFIX}"
            finally:
                t.close()
        # a console whose key is not the host's (another instance's text, a replaced host): no log-in
        swapped = pulumi_cluster(desc, key_file=str(hs.client_key), host_keys={0: keys[1], 1: keys[0]})
        t = swapped.transport(swapped.hosts[0])
        try:
            with pytest.raises(TransportError, match="(?i)host key"):
                t.run("true")
        finally:
            t.close()


@pytest.mark.skipif(shutil.which("pulumi") is not None, reason="the pulumi CLI is on PATH here")
def test_up_from_a_stack_name_without_the_pulumi_cli_says_how_to_go_on(tmp_path):
    (tmp_path / "key").write_text("unused")
    r = run_cli("-m", "orchestrate", "up", "--stack", "dev", "--key-file", str(tmp_path / "key"),
                "--out", str(tmp_path / "cluster.json"))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and "reading stack 'dev' needs the pulumi CLI on PATH" in said, said
    assert "`pulumi stack output --json --stack dev > outputs.json` — and pass --pulumi-outputs outputs.json" in said
    r = run_cli("-m", "orchestrate", "up", "--stack", "dev", "--local", "--out", str(tmp_path / "cluster.json"))
    assert r.returncode == 2 and "pass exactly one of --local, --stack and --pulumi-outputs" in " ".join(r.stderr.split())
    assert not (tmp_path / "cluster.json").exists()


def test_up_and_status_read_the_addresses_ec2_gives_now(aws, tmp_path):
    """An auto-assigned public IPv4 address is released at stop and a new one given at start (moto does
    the same): `up` builds cluster.json from the addresses EC2 reports now, refuses a stopped host by
    name, and `status` says when cluster.json no longer reaches a host."""
    from orchestrate.cluster import load
    from orchestrate.cluster import pulumi_cluster
    from orchestrate.status import address_warnings, outside_warnings

    ec2 = aws.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "trial", "Value": "keys-test"}, {"Key": "rank", "Value": str(r)}]}])
        ["Instances"][0]["InstanceId"] for r in range(2)]

    def public(i: str) -> str | None:
        return ec2.describe_instances(InstanceIds=[i])["Reservations"][0]["Instances"][0].get("PublicIpAddress")

    at_up = [public(i) for i in ids]  # what `pulumi up` recorded in the outputs
    out = tmp_path / "outputs.json"
    out.write_text(json.dumps(outputs([{"rank": r, "instance_id": i, "instance_type": "g6e.xlarge", "zone": "us-east-1c",
                                        "private_ip": f"10.42.0.{10 + r}", "public_ip": at_up[r]}
                                       for r, i in enumerate(ids)])))
    ec2.stop_instances(InstanceIds=[ids[1]])  # a deadline or guard stop ...
    (tmp_path / "key").write_text("unused")
    (tmp_path / "keys.json").write_text(json.dumps({"0": ED, "1": ECDSA}))
    up = ("-m", "orchestrate", "up", "--pulumi-outputs", str(out), "--key-file", str(tmp_path / "key"),
          "--host-keys", str(tmp_path / "keys.json"), "--out", str(tmp_path / "cluster.json"))
    r = run_cli(*up)
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and f"not running: rank 1 ({ids[1]}: stopped)" in said, said
    ec2.start_instances(InstanceIds=[ids[1]])  # ... and a start: a new public address
    assert public(ids[1]) != at_up[1]
    r = run_cli(*up)
    assert r.returncode == 0, r.stdout + r.stderr
    c = load(tmp_path / "cluster.json")
    assert [h.address for h in c.by_rank] == [at_up[0], public(ids[1])]
    # the outputs' addresses, as before: stale now, and `status` says so, by rank
    r = run_cli(*up, "--addresses", "outputs")
    stale = load(tmp_path / "cluster.json")
    assert r.returncode == 0 and stale.by_rank[1].address == at_up[1]
    now = {i.rank: i for i in trial_instances(aws, "keys-test")}  # as `status` reads them
    assert address_warnings(stale, now) == [f"rank 1 ({ids[1]}) is now at {public(ids[1])}, cluster.json says "
                                            f"{at_up[1]}: run `orchestrate up` again"]
    assert address_warnings(c, now) == []
    # #65: a second instance of rank 1 the stack never listed (an interrupted `up`'s create): `status` names it as
    # outside the stack, and still reads rank 1's host as the one cluster.json lists
    (extra,) = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "trial", "Value": "keys-test"},
                                                                         {"Key": "rank", "Value": "1"}]}])["Instances"]]
    found = trial_instances(aws, "keys-test")
    (said,) = outside_warnings(c, found)
    assert said.startswith(f"{extra} (rank 1, running, g6e.xlarge in ") and "not in cluster.json: outside the stack" in \
        said and f"terminate-instances --region us-east-1 --instance-ids {extra}" in said
    # one the stack's record holds (a replaced host pending deletion: `instances_held` in the outputs) is not outside
    held = pulumi_cluster(outputs([{"rank": h.rank, "instance_id": h.instance_id, "instance_type": "g6e.xlarge",
                                    "zone": "us-east-1c", "private_ip": h.private_address, "public_ip": h.address}
                                   for h in c.by_rank], trial="keys-test") | {"instances_held": [
                              {"instance_id": extra, "rank": 1}, *({"instance_id": h.instance_id, "rank": h.rank}
                                                                    for h in c.by_rank)]}, key_file="k")
    assert held.held_instances == [extra] and outside_warnings(held, found) == []
    listed = {h.instance_id for h in c.hosts}
    assert address_warnings(c, {i.rank: i for i in sorted(found, key=lambda i: i.instance_id in listed)}) == []

"""`orchestrate up --stack NAME` reads the stack's outputs through Pulumi's Automation API, which runs the
`pulumi` CLI with `--show-secrets`. On a stack whose secrets are kept with a passphrase (the default on a
self-managed backend) the CLI cannot prompt: without PULUMI_CONFIG_PASSPHRASE (or _FILE) the read is
refused before the CLI runs, naming the variable (#31 item 5). A fake `pulumi` on PATH records whether it
was run; no real CLI is needed or reached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.outputs import OutputsError, passphrase_problem, read_stack_outputs

PASSPHRASE_STACK = "encryptionsalt: v1:Q2h1bms=:v1:AAAAAAAAAAAAAAAA:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB\nconfig:\n  aws:region: us-east-1\n"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project directory with a passphrase-kept stack `dev`, a cloud-kept stack `svc`, and a fake CLI."""
    (tmp_path / "Pulumi.yaml").write_text("name: trials\nruntime: python\n")
    (tmp_path / "Pulumi.dev.yaml").write_text(PASSPHRASE_STACK)
    (tmp_path / "Pulumi.svc.yaml").write_text("config:\n  aws:region: us-east-1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'cli-ran'}\necho 'error: not a real CLI' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for k in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def test_a_passphrase_stack_without_its_passphrase_is_refused_by_name(project, monkeypatch):
    with pytest.raises(OutputsError, match="export PULUMI_CONFIG_PASSPHRASE \\(or PULUMI_CONFIG_PASSPHRASE_FILE"):
        read_stack_outputs("dev", project)
    assert not (project / "cli-ran").exists()  # refused before the CLI ran
    with pytest.raises(OutputsError, match="needs it without a prompt"):
        read_stack_outputs("my-org/trials/dev", project)  # a qualified name: its last part names the file
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", str(project / "missing"))
    with pytest.raises(OutputsError, match="PULUMI_CONFIG_PASSPHRASE_FILE names .*missing, which is not a file"):
        read_stack_outputs("dev", project)
    assert not (project / "cli-ran").exists()


def test_with_the_passphrase_or_another_provider_the_cli_is_asked(project, monkeypatch):
    assert passphrase_problem("svc", project) is None  # a service- or KMS-kept stack needs no passphrase
    assert passphrase_problem("gone", project) is None  # no stack file here: the CLI says what it finds
    (project / "Pulumi.kms.yaml").write_text("secretsprovider: awskms://alias/x\nencryptedkey: abc\n")
    assert passphrase_problem("kms", project) is None
    assert passphrase_problem("dev", project, {"PULUMI_CONFIG_PASSPHRASE": ""}) is None  # an empty one is a passphrase
    (project / "phrase").write_text("s3cret\n")
    assert passphrase_problem("dev", project, {"PULUMI_CONFIG_PASSPHRASE_FILE": str(project / "phrase")}) is None
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "s3cret")
    with pytest.raises(OutputsError, match="pulumi could not read stack 'dev'"):
        read_stack_outputs("dev", project)
    assert (project / "cli-ran").exists()  # this time the Automation API ran the (fake) CLI


def test_orchestrate_up_says_so(project, monkeypatch):
    """The same refusal through the CLI a user types, from the project directory."""
    from typer.testing import CliRunner

    from orchestrate.cli import app

    monkeypatch.chdir(project)
    r = CliRunner().invoke(app, ["up", "--stack", "dev", "--key-file", str(project / "id_ed25519"),
                                 "--out", str(project / "cluster.json")])
    said = " ".join((r.stdout + r.stderr).split())
    assert r.exit_code != 0 and "export PULUMI_CONFIG_PASSPHRASE" in said, said
    assert not (project / "cli-ran").exists() and not (project / "cluster.json").exists()

"""The hosts' wheelhouse is built for the hosts' Python and platform, a wrong one is refused before
anything is uploaded, and `plan` counts every byte of it.

The wheel names are those `pip download torch==2.13.0 --python-version 3.12 --platform …` chose for a
manylinux_2_39 x86_64 host (2026-12-02), with their sizes; the files here are sparse stand-ins of those
sizes (only `plan`'s byte count and the tag check read them). `orchestrate wheelhouse` runs the real
pip, offline, against a --find-links directory of small wheels made here."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import example_stack
from orchestrate.cli import app
from orchestrate.wheelhouse import platforms, unfit

TORCH_CP312 = {  # all 29, name: bytes, as pip downloaded them for CPython 3.12 on manylinux_2_39_x86_64
    "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl": 526_605_292,
    "nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl": 423_138_758,
    "nvidia_cudnn_cu13-9.20.0.48-py3-none-manylinux_2_27_x86_64.whl": 366_173_588,
    "nvidia_cufft-12.0.0.61-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": 214_085_489,
    "nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_x86_64.whl": 205_976_000,
    "nvidia_cusolver-12.0.4.66-py3-none-manylinux_2_27_x86_64.whl": 200_941_980,
    "triton-3.7.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": 197_719_725,
    "nvidia_cusparselt_cu13-0.8.1-py3-none-manylinux2014_x86_64.whl": 170_148_586,
    "nvidia_cusparse-12.6.3.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": 145_942_937,
    "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl": 90_215_200,
    "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": 60_412_546,
    "nvidia_curand-10.4.0.35-py3-none-manylinux_2_27_x86_64.whl": 59_544_258,
    "nvidia_nvjitlink-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl": 46_642_491,
    "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl": 10_715_597,
    "cuda_bindings-13.5.0-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl": 8_378_158,
    "sympy-1.14.0-py3-none-any.whl": 6_299_353,
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": 2_243_632,
    "networkx-3.7-py3-none-any.whl": 2_142_205,
    "nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": 1_223_672,
    "setuptools-84.2.1-py3-none-any.whl": 876_263,
    "mpmath-1.3.0-py3-none-any.whl": 536_198,
    "filelock-4.3.1-py3-none-any.whl": 244_559,
    "fsspec-2026.9.0-py3-none-any.whl": 221_738,
    "nvidia_nvtx-13.0.85-py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl": 148_047,
    "jinja2-3.1.6-py3-none-any.whl": 134_899,
    "cuda_pathfinder-1.9.1-py3-none-any.whl": 63_462,
    "typing_extensions-4.16.0-py3-none-any.whl": 45_571,
    "markupsafe-3.0.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl": 22_985,
    "cuda_toolkit-13.0.3.0-py2.py3-none-any.whl": 2_512,
}
FOR_THE_CONTROLLER = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"  # what this machine runs


def sparse_wheels(d: Path, sizes: dict[str, int]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, n in sizes.items():
        with open(d / name, "wb") as f:
            f.truncate(n)
    return d


def test_the_hosts_tags_are_the_ones_pip_chose_for_them():
    assert unfit(TORCH_CP312, "3.12", "manylinux_2_39_x86_64") == []
    # for another Python: every CPython-specific wheel, not the pure ones (py3-none-…)
    assert unfit(TORCH_CP312, "3.11", "manylinux_2_39_x86_64") == sorted(
        n for n in TORCH_CP312 if "-cp312-" in n)
    # on an older glibc (Ubuntu 20.04's 2.31 would still do; manylinux2014's 2.17 would not)
    assert unfit(TORCH_CP312, "3.12", "manylinux_2_31_x86_64") == []
    assert "nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_x86_64.whl" in unfit(
        TORCH_CP312, "3.12", "manylinux_2_17_x86_64")
    assert unfit([FOR_THE_CONTROLLER, "trials-0.1.0-py3-none-any.whl"], "3.12") == [FOR_THE_CONTROLLER]
    # pip's --platform matches tags exactly: every older manylinux tag is listed, the aliases too
    p = platforms("manylinux_2_39_x86_64")
    assert {"manylinux_2_18_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(p) and p[0].endswith("2_39_x86_64")


def test_plan_counts_the_wheelhouse_and_refuses_one_for_another_python(tmp_path):
    from infra.plan import staging_bytes_per_host
    from orchestrate.cli.plan import _stack_config
    from orchestrate.stages.plan import plan_arm, staging_upload

    stack = example_stack(tmp_path)
    cfg = _stack_config(stack)
    import datetime as dt

    now = dt.datetime.now(dt.timezone.utc)
    wheels = sparse_wheels(tmp_path / "wheels", TORCH_CP312)
    total = sum(TORCH_CP312.values())
    assert total == 2_740_845_701  # torch and its CUDA libraries: 2.74 GB, not the project's few hundred kB
    est = plan_arm(cfg, stack, "diloco-four", wheelhouse=wheels, uplink_mbps=100, quota=False, now=now)
    assert est.staging.wheelhouse_bytes == total
    assert est.staging.bytes == 4 * cfg.parameters + total + 4 * 1_000_000  # once, then the project's wheel
    assert est.staging.ssh_only_bytes == 4 * (4 * cfg.parameters + total)
    assert staging_bytes_per_host(cfg, total) == 4 * cfg.parameters + total  # what the isolated host's guard sees
    assert est.problems == []
    without = staging_upload(cfg, None, 100)
    assert est.staging.hours > without.hours
    sparse_wheels(wheels, {FOR_THE_CONTROLLER: 1000})
    est = plan_arm(cfg, stack, "diloco-four", wheelhouse=wheels, uplink_mbps=100, quota=False, now=now)
    (problem,) = est.problems
    assert f"1 wheel(s) of the wheelhouse do not install on the hosts' CPython 3.12 on manylinux_2_39_x86_64 " \
           f"({FOR_THE_CONTROLLER})" in problem and "orchestrate wheelhouse" in problem


def test_staging_refuses_wheels_for_another_python_before_any_upload(tmp_path):
    """A host whose Python is this machine's (3.11 here) and a wheelhouse built for 3.12: refused naming
    the host and the wheels, and nothing reaches the host's root."""
    from orchestrate.cluster import local_cluster
    from orchestrate.remote import StagingError, stage_reports
    from orchestrate.transport import LocalTransport

    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.12" if mine != "3.12" else "3.13"
    tag = f"cp{other.replace('.', '')}"
    c = local_cluster(2, tmp_path / "hosts", "file:///unused")
    c = c.model_copy(update={"hosts": [h.model_copy(update={"python": sys.executable}) for h in c.hosts]})
    wheels = sparse_wheels(tmp_path / "wheels", {f"torch-2.13.0-{tag}-{tag}-manylinux_2_28_x86_64.whl": 4096,
                                                  "sympy-1.14.0-py3-none-any.whl": 1024})
    with pytest.raises(StagingError, match=rf"local-0: .* is Python {mine}\.\d+; nothing was uploaded\. 1 wheel\(s\) "
                                           rf"of the wheelhouse do not install on the hosts' CPython {mine} "
                                           rf"\(torch-2\.13\.0-{tag}-{tag}-manylinux_2_28_x86_64\.whl\)"):
        stage_reports(c, [LocalTransport(), LocalTransport()], wheel_dir=wheels, files={})
    assert not (tmp_path / "hosts").exists() or not any((tmp_path / "hosts").rglob("*.whl"))


def make_wheel(d: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD), enough for pip to resolve and download it."""
    d.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }

    def row(path: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}\n"

    record = "".join(row(p, b) for p, b in files.items()) + f"{info}/RECORD,,\n"
    out = d / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
        z.writestr(f"{info}/RECORD", record)
    return out


@pytest.fixture
def index(tmp_path) -> Path:
    """A package's wheels for two Pythons, and a dependency tagged only for an older glibc
    (manylinux_2_18, as NCCL's wheel is): found only when every older tag is asked for."""
    d = tmp_path / "index"
    for py in ("cp311", "cp312"):
        make_wheel(d, "demo", "1.0", f"{py}-{py}-manylinux_2_28_x86_64", requires=("demodep==2.0",))
    make_wheel(d, "demodep", "2.0", "py3-none-manylinux_2_18_x86_64")
    return d


def test_the_wheelhouse_command_downloads_for_the_hosts_python(index, tmp_path):
    out = tmp_path / "wheels"
    args = ["wheelhouse", str(out), "--python-version", "3.12", "--platform", "manylinux_2_39_x86_64",
            "--requirement", "demo==1.0", "--find-links", str(index), "--no-index"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.glob("*.whl")) == [
        "demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "demodep-2.0-py3-none-manylinux_2_18_x86_64.whl"]
    assert "2 wheel(s)" in r.output and "for CPython 3.12 on manylinux_2_39_x86_64" in r.output
    # the stack names the hosts' Python: the shipped defaults are the DLAMI's (3.12, glibc 2.39)
    out2 = tmp_path / "wheels-from-stack"
    r = CliRunner().invoke(app, ["wheelhouse", str(out2), "--stack", str(example_stack(tmp_path)),
                                 "--requirement", "demo==1.0", "--find-links", str(index), "--no-index"])
    assert r.exit_code == 0, r.output
    assert {p.name for p in out2.glob("*.whl")} == {p.name for p in out.glob("*.whl")}
    # a directory holding wheels for another Python (an earlier build for the controller) is refused
    make_wheel(out, "stale", "1.0", "cp311-cp311-manylinux_2_28_x86_64")
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2
    assert "stale-1.0-cp311-cp311-manylinux_2_28_x86_64.whl" in " ".join(r.output.split())

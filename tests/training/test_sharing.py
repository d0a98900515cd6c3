"""Processes that share a GPU on purpose: the device lock admits one job's processes and refuses any
other job, whichever way round they come; what the controller puts in a process's environment, and
what a rank makes of it (its device, its group's backend)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrate.launch.command import device_share, process_env
from training.errors import DeviceBusy, RuntimeSetupError
from training.runtime import group_backend, hold_device, pick_device
from training.sharing import DEVICE_JOB_ENV, SHARED_GPUS_ENV, DeviceShare

HOLDER = """
import sys, time
from pathlib import Path
from training.runtime import hold_device
fh = hold_device(Path(sys.argv[1]), sys.argv[2] or None, "GPU 0")
print("held", flush=True)
time.sleep(600)
"""


class Holder:
    """A process that holds the lock for `job` (None: exclusively) until stopped, by its own pid."""

    def __init__(self, path: Path, job: str | None):
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), job or ""], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if line.strip() != "held":
            self.stop()
            raise DeviceBusy(self.p.stderr.read().strip().splitlines()[-1])

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def lock(tmp_path):
    held: list[Holder] = []

    def take(job: str | None) -> Holder:
        h = Holder(tmp_path / "cuda0.lock", job)
        held.append(h)
        return h

    yield take
    for h in held:
        h.stop()


def test_one_jobs_processes_share_and_every_other_job_is_refused(lock, tmp_path):
    path = tmp_path / "cuda0.lock"
    a0, a1 = lock("trial-a"), lock("trial-a")  # a co-located group: one job, two processes
    with pytest.raises(DeviceBusy, match="shared by the processes of job trial-a .*, not trial-b"):
        hold_device(path, "trial-b", "GPU 0")  # another co-located trial
    with pytest.raises(DeviceBusy, match="shared by the processes of job trial-a"):
        hold_device(path, None, "GPU 0")  # an ordinary trial or scoring job
    a0.stop()
    with pytest.raises(DeviceBusy, match="trial-a"):  # one process of the job still holds it
        hold_device(path, "trial-b", "GPU 0")
    a1.stop()
    # the last holder gone (however it ended), the next job takes it: a stale name refuses no one
    b = hold_device(path, "trial-b", "GPU 0")
    assert (tmp_path / "cuda0.lock.job").read_text() == "trial-b"
    b.close()


def test_an_exclusive_holder_refuses_every_sharing_job(lock, tmp_path):
    path = tmp_path / "cuda0.lock"
    solo = lock(None)
    for job in (None, "trial-a"):
        with pytest.raises(DeviceBusy, match="in use by another training or evaluation job"):
            hold_device(path, job, "GPU 0")
    solo.stop()
    fh = hold_device(path, None, "GPU 0")
    with pytest.raises(DeviceBusy):
        Holder(path, "trial-a")  # and the other way round, from another process
    fh.close()


def test_the_environment_a_sharing_process_gets():
    share = device_share(1, "group-7")
    assert share is not None and share.gpus == 1 and share.job.startswith("group-7:")
    assert device_share(None, "group-7") is None
    env = process_env(2, here=True, threads=1, inherited={SHARED_GPUS_ENV: "9", DEVICE_JOB_ENV: "stale"},
                      share=share)
    assert DeviceShare.from_env(env) == share
    # never inherited: only a placement that shares sets them
    plain = process_env(2, here=True, threads=1, inherited={SHARED_GPUS_ENV: "9", DEVICE_JOB_ENV: "stale"})
    assert DeviceShare.from_env(plain) is None
    with pytest.raises(ValueError, match="only by processes on this machine"):
        process_env(0, here=False, threads=1, share=share)
    for bad in ({SHARED_GPUS_ENV: "1"}, {DEVICE_JOB_ENV: "j"}, {SHARED_GPUS_ENV: "0", DEVICE_JOB_ENV: "j"}):
        with pytest.raises(RuntimeSetupError, match="sharing GPUs needs both"):
            DeviceShare.from_env(bad)


def test_a_sharing_rank_takes_gpu_r_mod_m_and_reduces_through_gloo(monkeypatch):
    taken = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", taken.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: taken[-1])
    share = DeviceShare(2, "j")
    assert [pick_device("cuda", r, share).index for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(RuntimeSetupError, match="LOCAL_RANK=2 has no GPU of its own.*--share-gpus"):
        pick_device("cuda", 2)
    with pytest.raises(RuntimeSetupError, match="TRIAL_SHARED_GPUS=3 but 2 GPU"):
        pick_device("cuda", 0, DeviceShare(3, "j"))
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert (group_backend(cuda, None), group_backend(cuda, share), group_backend(cpu, share)) == ("nccl", "gloo", "gloo")

"""Where a rank runs: identity, process group, numerical settings and whole-process figures.

The numerical profile is the set of settings that change the numbers a run produces (library
versions, device model, dtypes, TF32/determinism switches, collective algorithm variables). Its
digest must be identical on every rank and is committed before training; hostnames, addresses and
timings are recorded but left out, so an identical replacement host keeps the same profile.
"""

from __future__ import annotations

import fcntl
import os
import platform
import resource
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from evidence.canonical import canonical_sha256
from training.errors import DeviceBusy, RuntimeSetupError
from training.identity import RankInfo
from training.sharing import SHARED_GPUS_ENV, DeviceShare

_PROCESS_T0 = time.monotonic()
NUMERIC_ENV = ("NCCL_ALGO", "NCCL_PROTO", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")
RUNTIME_ENV = NUMERIC_ENV + ("OMP_NUM_THREADS", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME",
                             "GLOO_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
                             "NCCL_NVLS_ENABLE", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
                             "TRIAL_SHARED_GPUS", "TRIAL_DEVICE_JOB")



def pick_device(kind: str, local_rank: int, share: DeviceShare | None = None) -> torch.device:
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeSetupError("this profile trains on CUDA but no CUDA device is visible "
                                    "(use the cpu or smoke profile on this machine)")
        n = torch.cuda.device_count()
        if share is not None:
            if share.gpus > n:
                raise RuntimeSetupError(f"{SHARED_GPUS_ENV}={share.gpus} but {n} GPU(s) are visible")
            index = local_rank % share.gpus
        elif not 0 <= local_rank < n:  # sharing a GPU unasked would only meet the other rank's device lock
            raise RuntimeSetupError(f"LOCAL_RANK={local_rank} has no GPU of its own: {n} visible; every rank "
                                    f"on a host needs its own GPU unless the run shares them on purpose "
                                    f"(orchestrate run --share-gpus); without it, orchestrate run reports an arm "
                                    f"that needs more GPUs than the cluster has as not run, before anything launches")
        else:
            index = local_rank
        torch.cuda.set_device(index)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_lock(device: torch.device, share: DeviceShare | None = None) -> Any:
    """Hold an OS lock on a GPU for the life of the process, or refuse at once: exclusively, or
    shared with the other processes of `share.job` alone (`hold_device`).

    Taken before the model is allocated, so an overlapping job by the same user fails fast instead
    of both jobs running out of memory halfway.
    """
    if device.type != "cuda":
        return None
    # TRIAL_LOCK_DIR: an operator's, where jobs that share the GPUs do not share /tmp (containers, systemd's
    # PrivateTmp): a lock guards only against the processes that see the same file
    path = Path(os.environ.get("TRIAL_LOCK_DIR", "/tmp")) / f"trials-{os.getuid()}-cuda{device.index}.lock"
    return hold_device(path, share.job if share else None, f"GPU {device.index}")


def hold_device(path: Path, job: str | None, what: str) -> Any:
    """Take `path`'s flock for `job` (None: exclusively) and return the open file that holds it.

    The processes of one job hold it shared and name their job in `<path>.job`; anyone else meets
    either an exclusive holder or another job's name and is refused (DeviceBusy). Every decision is
    made under a short exclusive flock on `<path>.meta`, so taking the lock and naming the job, or
    reading the name, happen as one step; the kernel drops a holder's lock when it ends however it
    ends, and the first taker after the last holder renames the job, so a stale name refuses no one."""
    meta = open(path.with_name(path.name + ".meta"), "a+")
    try:
        fcntl.flock(meta, fcntl.LOCK_EX)
        fh = open(path, "a+")
        owner = path.with_name(path.name + ".job")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:  # free
            if job is not None:
                owner.write_text(job)
                fcntl.flock(fh, fcntl.LOCK_SH)  # no one can come between: they wait for `meta`
            return fh
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise DeviceBusy(f"{what} is in use by another training or evaluation job (lock {path}); wait for "
                             "it or pick another GPU") from None
        holder = owner.read_text() if owner.is_file() else "?"
        if job is None or holder != job:
            fh.close()
            raise DeviceBusy(f"{what} is shared by the processes of job {holder} (lock {path})"
                             + ("" if job is None else f", not {job}") + "; wait for it or pick another GPU")
        return fh
    finally:
        meta.close()


def group_backend(device: torch.device, share: DeviceShare | None) -> str:
    """NCCL for a GPU of its own, gloo on CPU and for ranks that share GPUs (DeviceShare says why)."""
    return "nccl" if device.type == "cuda" and share is None else "gloo"


def init_group(info: RankInfo, device: torch.device, timeout_s: float = 600,
               share: DeviceShare | None = None) -> None:
    if info.world_size == 1:
        return
    backend = group_backend(device, share)
    dist.init_process_group(backend, rank=info.rank, world_size=info.world_size,
                            timeout=timedelta(seconds=timeout_s),
                            device_id=device if backend == "nccl" else None)


DETERMINISTIC_CUBLAS = ":4096:8"
"""cuBLAS's fixed workspace: without it a cuBLAS call may split its reduction differently from call to
call, and torch refuses it under deterministic algorithms (docs: torch.use_deterministic_algorithms)."""


def configure_numerics(device: torch.device, *, deterministic: bool = False) -> None:
    """Fixed switches: no TF32 (bf16 autocast is explicit), deterministic cuDNN; with `deterministic`
    (the profile's), every kernel with a deterministic implementation uses it and any without one
    raises, so two runs of the same inputs equal bit for bit. Without it, padded attention's backward
    and the embedding's accumulate with atomics on CUDA, and a run's second update already differs from
    another's (bench/results/2026-12-06-deterministic-recovery-1xh100/)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if deterministic:
        # read by cuBLAS when this process first uses it (after this point): an operator's own value stands
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS)
        torch.use_deterministic_algorithms(True)  # inductor's lowerings follow it too (deterministic fallbacks)
        import torch._inductor.config as inductor  # start-up: only a deterministic rank pays for it

        inductor.deterministic = True  # a compiled step: no on-device autotuning that could pick other kernels


def numerical_profile(device: torch.device, *, dtype: str, arm: dict[str, Any],
                      attention: str, backend: str | None = None) -> dict[str, Any]:
    import transformers  # start-up: ~1 s, loaded where the model is (a rank's model_load_seconds)

    prof: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_type": device.type,
        "parameter_dtype": "float32",
        "autocast_dtype": dtype if device.type == "cuda" and dtype != "float32" else None,
        "attention": attention,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        # only where on: every profile committed before the setting keeps its digest
        **({"deterministic_algorithms": True} if torch.are_deterministic_algorithms_enabled() else {}),
        "backend": backend or group_backend(device, None),
        "env": {k: os.environ.get(k) for k in NUMERIC_ENV},
        "arm": arm,
    }
    if device.type == "cuda":
        prof["cuda"] = torch.version.cuda
        prof["device_name"] = torch.cuda.get_device_name(device)
        prof["capability"] = list(torch.cuda.get_device_capability(device))
    return prof


def profile_digest(profile: dict[str, Any]) -> str:
    return canonical_sha256(profile)


def runtime_settings(device: torch.device) -> dict[str, Any]:
    """Everything about where this rank ran (recorded, not part of the numerical identity)."""
    out: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in RUNTIME_ENV},
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out["gpu"] = {"name": p.name, "total_memory": p.total_memory, "index": device.index}
    return out


def net_counters() -> dict[str, dict[str, int]]:
    """Whole-host byte counters per interface (/proc/net/dev): all traffic, not just ours."""
    out: dict[str, dict[str, int]] = {}
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        f = rest.split()
        if len(f) >= 9:
            out[name.strip()] = {"rx_bytes": int(f[0]), "tx_bytes": int(f[8])}
    return out


def net_delta(after: dict, before: dict) -> dict[str, dict[str, int]]:
    return {k: {f: v[f] - before.get(k, {}).get(f, 0) for f in v} for k, v in after.items()}


def process_figures(device: torch.device) -> dict[str, Any]:
    """Whole-process resources so far: CPU time, peak RSS, wall since start, device memory."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "wall_seconds_since_start": time.monotonic() - _PROCESS_T0,
        "user_cpu_seconds": ru.ru_utime,
        "system_cpu_seconds": ru.ru_stime,
        "max_rss_bytes": ru.ru_maxrss * 1024,
    }
    if device.type == "cuda":
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out

"""Two ranks' states compared tensor by tensor: did a restart or a change alter the numerics?"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from training.arms import CHECKPOINT_PARTS

NUMERICAL_PARTS = ("update", "model", "optimizer", "rng", *CHECKPOINT_PARTS)  # the arm kinds' extra states


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Tensor-content comparison of two rank states (never file hashes: the pickled skeleton's bytes are not
    canonical). Per part: tensors compared, elements, max |Δ|, and any non-tensor leaf that differs.
    Timing records (journal, ledger) are not numerical state and are left out."""
    out: dict[str, Any] = {}
    for part in NUMERICAL_PARTS:
        acc = {"tensors": 0, "elements": 0, "max_abs_diff": 0.0, "mismatches": []}

        def walk(x: Any, y: Any, path: str) -> None:
            if torch.is_tensor(x) or isinstance(x, np.ndarray):
                tx = torch.as_tensor(x).detach().cpu()
                ty = torch.as_tensor(y).detach().cpu() if (torch.is_tensor(y) or
                                                            isinstance(y, np.ndarray)) else None
                if ty is None or tx.shape != ty.shape or tx.dtype != ty.dtype:
                    acc["mismatches"].append(f"{path}: shape/dtype/type differs")
                    return
                acc["tensors"] += 1
                acc["elements"] += tx.numel()
                if tx.numel():
                    fx, fy = tx.to(torch.float64), ty.to(torch.float64)
                    same_nan = torch.isnan(fx) & torch.isnan(fy)
                    diff = (fx - fy).abs().masked_fill(same_nan, 0.0)
                    if torch.isnan(diff).any():  # NaN on one side only: never "identical"
                        acc["mismatches"].append(f"{path}: NaN on one side")
                        diff = diff.nan_to_num(nan=float("inf"))
                    d = diff.max().item()
                    if d == 0.0 and not torch.equal(tx.view(-1).view(torch.uint8) if tx.is_floating_point()
                                                    else tx, ty.view(-1).view(torch.uint8)
                                                    if ty.is_floating_point() else ty):
                        acc["mismatches"].append(f"{path}: bitwise different (e.g. -0.0)")
                    acc["max_abs_diff"] = max(acc["max_abs_diff"], d)
            elif isinstance(x, dict):
                if not isinstance(y, dict) or set(x) != set(y):
                    acc["mismatches"].append(f"{path}: keys differ")
                    return
                for k in x:
                    walk(x[k], y[k], f"{path}/{k}")
            elif isinstance(x, (list, tuple)):
                if not isinstance(y, (list, tuple)) or len(x) != len(y):
                    acc["mismatches"].append(f"{path}: length differs")
                    return
                for i, (xi, yi) in enumerate(zip(x, y)):
                    walk(xi, yi, f"{path}/{i}")
            elif hasattr(x, "get_state") and hasattr(y, "get_state"):  # numpy RandomState
                walk(x.get_state(), y.get_state(), f"{path}/state")
            elif x != y:
                acc["mismatches"].append(f"{path}: {x!r} != {y!r}")

        walk(a.get(part), b.get(part), part)
        out[part] = acc
    out["max_abs_diff"] = max(v["max_abs_diff"] for v in out.values() if isinstance(v, dict))
    out["identical"] = out["max_abs_diff"] == 0.0 and not any(
        v["mismatches"] for v in out.values() if isinstance(v, dict))
    return out

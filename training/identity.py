"""A rank's identity, from the environment its launcher set (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Apart from training/runtime.py, which imports torch: a rank reads who it is, and checks its
inputs, before any library loads, so a refused rank never pays for loading them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from training.errors import RuntimeSetupError


@dataclass(frozen=True)
class RankInfo:
    world_size: int
    rank: int
    local_rank: int
    master_addr: str | None
    master_port: int | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "RankInfo":
        env = dict(os.environ if env is None else env)
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        if world > 1:
            missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
            if missing:
                raise RuntimeSetupError(f"WORLD_SIZE={world} but {', '.join(missing)} not set; "
                                        "every rank needs RANK, MASTER_ADDR and MASTER_PORT")
        if not 0 <= rank < world:
            raise RuntimeSetupError(f"RANK={rank} is outside WORLD_SIZE={world}")
        port = env.get("MASTER_PORT")
        return cls(world, rank, int(env.get("LOCAL_RANK", "0")), env.get("MASTER_ADDR"),
                   int(port) if port else None)

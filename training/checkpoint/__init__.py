"""Durable group checkpoints, by job: `state_file` (the format of one rank's `state.bin`: write,
read, hash), `group` (the ranks' protocol: publish a step, agree on one, restore it), `compare`
(two states, tensor by tensor), `disk_baseline` (the disk's own rate, to set a write against).
Paths and manifests' names, torch-free for the controller, are `training.runs`.

`_Ref` is defined here, not in `state_file`, because pickle records a class by where it is defined:
every `state.bin` written so far names `training.checkpoint._Ref`, and must still load.
"""

from __future__ import annotations


class _Ref:
    """Where a large tensor stood in the state: the index of its entry in the file's table."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self) -> tuple:
        return (_Ref, (self.index,))

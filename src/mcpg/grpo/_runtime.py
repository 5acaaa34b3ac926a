"""Process plumbing of the GRPO training loop: processes and collectives, RNG states, JSON files.

Nothing here is paper-specific; it keeps :mod:`mcpg.grpo.train` readable as the update's steps.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

__all__ = ["Dist", "close_process_group", "rng_state", "set_rng_state", "write_json", "json_default"]


class Dist:
    """Process info and collectives; a no-op wrapper when there is one process."""

    def __init__(self, device: str):
        from accelerate import Accelerator

        self.acc = Accelerator(cpu=(device == "cpu"))
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        self.main = self.acc.is_main_process
        self.device = self.acc.device

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def gather(self, obj: list) -> list:
        if self.world == 1:
            return obj
        from accelerate.utils import gather_object

        return gather_object(obj)

    def barrier(self):
        if self.world > 1:
            self.acc.wait_for_everyone()


def close_process_group(wait: bool = True) -> None:
    """Shut down torch.distributed's default process group, if one was started.

    Under ``accelerate launch`` each process holds a gloo (or NCCL) group whose threads must
    stop before the interpreter exits; left to exit, a worker can abort with "terminate
    called without an active exception" after the run has finished. ``wait``: meet the
    other processes first (on success; after an error they may never arrive).
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()


def rng_state(data_rng, select_rng) -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy_data": data_rng.bit_generator.state,
        "numpy_select": select_rng.bit_generator.state,
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, data_rng, select_rng) -> None:
    torch.set_rng_state(state["torch"])
    data_rng.bit_generator.state = state["numpy_data"]
    select_rng.bit_generator.state = state["numpy_select"]
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` (its folder made if missing), atomically:
    a reader never sees half a file, and numpy scalars and arrays are written as numbers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=json_default) + "\n")
    os.replace(tmp, path)


def json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")

"""Host-device synchronisations inside a training step: counted by CUDA itself on a GPU
(`torch.cuda.set_sync_debug_mode`), and on the CPU by the calls that would synchronise on a GPU (reading a
value or a shape that depends on values back to the host), each with the line of lace that made it."""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode

SOURCE = str(Path(__file__).resolve().parents[2] / "src" / "lace")
# Tensor methods and functions whose result a GPU must finish the queued work to give: a Python value, a host
# copy, or an output whose size depends on the values.
READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__bool__,
    torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
    torch.Tensor.unique, torch.unique, torch.Tensor.unique_consecutive, torch.unique_consecutive,
    torch.Tensor.masked_select, torch.masked_select, torch.Tensor.repeat_interleave, torch.repeat_interleave,
}


def _caller() -> str:
    """The innermost function of lace's own source on the stack, as path:function (lines move with every edit)."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(SOURCE):
            return f"{frame.filename[len(SOURCE) + 1:]}:{frame.name}"
    return "outside lace"


class HostReads(TorchFunctionMode):
    """Counts, by function of lace, the calls in `READS` and indexing by a boolean mask, on tensors of any device."""

    def __init__(self):
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked = func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _has_mask(args[1])
        if func in READS or masked:
            self.seen[_caller()] += 1
        return func(*args, **kwargs)


def _has_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in parts)


class StepWindow:
    """Runs `start` when `train` hands over its first micro-batch (`on_batch`) and `stop` when the optimiser is
    about to step: the window is the training step itself (forward, negatives, loss, backward), without the
    set-up before it and the logging and checkpoints after it."""

    def __init__(self, start, stop):
        self.start, self.stop, self.open = start, stop, False

    def on_batch(self, number: int, indices: list[int]) -> None:
        if number == 0:
            self.open = True
            self.start()

    def _close(self, *_) -> None:
        if self.open:
            self.open = False
            self.stop()

    def __enter__(self):
        self.handle = register_optimizer_step_pre_hook(self._close)
        return self

    def __exit__(self, *_) -> None:
        self.handle.remove()
        self._close()


@contextmanager
def step_syncs(device: str):
    """(window, found): `window.on_batch` goes to `train`; on exit `found` lists the synchronisations inside the
    step (CUDA's own count on a GPU; on the CPU, `HostReads`' calls that would synchronise there)."""
    found: list[str] = []
    if device == "cuda":
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with StepWindow(lambda: torch.cuda.set_sync_debug_mode("warn"),
                            lambda: torch.cuda.set_sync_debug_mode(previous)) as window:
                yield window, found
        found += [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    else:
        reads = HostReads()
        with StepWindow(reads.__enter__, lambda: reads.__exit__(None, None, None)) as window:
            yield window, found
        found += sorted(reads.seen)

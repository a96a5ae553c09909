"""WiSE-FT (Wortsman et al., CVPR 2022): weight-space ensembles of a base model and its fine-tune.

`theta(alpha) = (1 - alpha) theta_base + alpha theta_finetuned`, tensor by tensor, on two
state dicts of the same architecture; alpha 0 is the base, 1 the fine-tune.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lace.errors import LaceInputError
from lace.io import read_safetensors


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a safetensors file or a `torch.save`d dict of tensors (`weights_only=True`)."""
    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: checkpoint file not found")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise LaceInputError(f"{path}: not a safetensors file or a torch state dict ({error})") from error
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise LaceInputError(f"{path}: expected a state dict of tensors")
    return state


def check_same_architecture(
    base: dict[str, torch.Tensor], finetuned: dict[str, torch.Tensor], base_name: str = "base",
    finetuned_name: str = "fine-tuned",
) -> None:
    """Refuse two state dicts whose keys or tensor shapes differ, naming the first differences."""
    missing, extra = sorted(set(finetuned) - set(base)), sorted(set(base) - set(finetuned))
    shapes = [f"{key} {tuple(base[key].shape)} vs {tuple(finetuned[key].shape)}"
              for key in finetuned if key in base and base[key].shape != finetuned[key].shape]
    if missing or extra or shapes:
        raise LaceInputError(
            f"{base_name}: not the architecture of {finetuned_name}: keys only in {finetuned_name} {missing[:5]}, "
            f"only in {base_name} {extra[:5]}, different shapes {shapes[:5]}"
        )


def interpolate_state_dicts(
    base: dict[str, torch.Tensor], finetuned: dict[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """`(1 - alpha) base + alpha finetuned` for every floating-point tensor, in float32 then cast back.

    Integer tensors (counters such as BatchNorm's `num_batches_tracked`, index buffers) are
    not averaged: they are taken from the fine-tune. Raises `LaceInputError` when the
    architectures differ and `ValueError` for alpha outside [0, 1].
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: expected a weight in [0, 1] (0 = base, 1 = fine-tune), got {alpha}")
    check_same_architecture(base, finetuned)
    mixed = {}
    for key, tuned in finetuned.items():
        if not tuned.is_floating_point():
            mixed[key] = tuned.clone()
            continue
        start = base[key].to(device=tuned.device, dtype=torch.float32)
        mixed[key] = torch.lerp(start, tuned.float(), alpha).to(tuned.dtype).contiguous()
    return mixed

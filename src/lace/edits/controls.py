"""The two controls of every dictionary edit, defined once for training and evaluation alike.

Both keep the planned edit's slots and its step size |(a' - a) D| in the centred space:
- random: an isotropic random direction;
- concept_arithmetic: plain concept directions, e_c' - e_c for transplant and swap (from the
  heavier concept to the lighter one), -e_c for attenuate; a rebind already moves along
  (compound) concept directions, so its concept-arithmetic control is itself.
`CounterfactualEditor.apply(..., control=...)`, `.random_control` and `.concept_arithmetic` use them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lace.edits.kernels import ATTENUATE, REBIND, SWAP
from lace.row_random import Randomness, normal

CONTROLS = ("random", "concept_arithmetic")


def random_step(step: Tensor, step_size: Tensor, generator: Randomness) -> Tensor:
    """Isotropic random steps (B, M, d) of the sizes (B, M) of the planned steps (B, M, d)."""
    noise = normal(tuple(step.shape), generator, step.device)
    return noise / noise.norm(dim=-1, keepdim=True).clamp_min(1e-12) * step_size.unsqueeze(-1)


def arithmetic_step(kind: Tensor, step: Tensor, step_size: Tensor, source_direction: Tensor,
                    target_direction: Tensor, source_weight: Tensor, target_weight: Tensor) -> Tensor:
    """Steps (B, M, d) along concept directions (B, M, d) of the sources and targets, same sizes (B, M)."""
    towards_target = target_direction - source_direction
    # a swap moves weight from the heavier concept to the lighter one
    sign = torch.where(source_weight >= target_weight, 1.0, -1.0).unsqueeze(-1)
    direction = torch.where((kind == ATTENUATE).unsqueeze(-1), -source_direction,
                            torch.where((kind == SWAP).unsqueeze(-1), sign * towards_target, towards_target))
    # a rebind is made of concept (compound) directions already: its arithmetic twin is itself
    direction = torch.where((kind == REBIND).unsqueeze(-1), step, direction)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return direction * step_size.unsqueeze(-1)

"""Pure per-kind kernels: what each edit does to (B, M) concept weights and (B, K) codes,
and what its effect check asks of the concept readouts. No state, no randomness.

An edit of code a (B, K) in slot m is

    a' - a = a * (source atoms * source_coef + target atoms * target_coef) + mass * pattern,

so each kind is three (B, M) numbers per slot: `EditCoefficients`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

ATTENUATE, SWAP, TRANSPLANT, REBIND = range(4)
CODE_KINDS = 3  # the kinds that edit the sparse code; rebind comes after them


class EditCoefficients(NamedTuple):
    """(B, M) each: the scale of the source's and target's owned codes, and the mass added
    over the target's typical pattern."""

    source: Tensor
    target: Tensor
    mass: Tensor


def attenuate(source_weight: Tensor, gamma: float) -> EditCoefficients:
    """The source's atoms scaled by gamma."""
    zeros = torch.zeros_like(source_weight)
    return EditCoefficients(torch.full_like(source_weight, gamma - 1.0), zeros, zeros)


def swap(source_weight: Tensor, target_weight: Tensor) -> EditCoefficients:
    """Each concept takes the other's total weight, in proportion to its own pattern."""
    safe_source = source_weight.clamp_min(1e-12)
    safe_target = target_weight.clamp_min(1e-12)
    return EditCoefficients(target_weight / safe_source - 1.0, source_weight / safe_target - 1.0,
                            torch.zeros_like(source_weight))


def transplant(source_weight: Tensor, strength: float) -> EditCoefficients:
    """The source removed; strength x its weight added over the target's typical pattern."""
    zeros = torch.zeros_like(source_weight)
    return EditCoefficients(-torch.ones_like(source_weight), zeros, strength * source_weight)


def select_coefficients(kind: Tensor, edits_code: Tensor, by_kind: dict[int, EditCoefficients]) -> EditCoefficients:
    """Per slot, the coefficients of its kind (B, M); zero where the slot edits no code."""
    def pick(field: int) -> Tensor:
        attenuated, swapped, transplanted = (by_kind[k][field] for k in (ATTENUATE, SWAP, TRANSPLANT))
        return torch.where(kind == ATTENUATE, attenuated, torch.where(kind == SWAP, swapped, transplanted))

    source, target = pick(0) * edits_code, pick(1) * edits_code
    mass = torch.where(kind == TRANSPLANT, by_kind[TRANSPLANT].mass, torch.zeros_like(source))
    return EditCoefficients(source, target, mass)


def code_delta(codes: Tensor, coefficients: EditCoefficients, source_atoms: Tensor, target_atoms: Tensor,
               pattern: Tensor) -> Tensor:
    """a' - a (B, M, K) for codes (B, K), coefficients (B, M) each, source and target atom
    masks (B, M, K) and the target's typical pattern (B, M, K)."""
    delta = codes.unsqueeze(1) * (source_atoms * coefficients.source.unsqueeze(-1)
                                  + target_atoms * coefficients.target.unsqueeze(-1))
    return delta + coefficients.mass.unsqueeze(-1) * pattern


def attenuated(source_before: Tensor, source_after: Tensor, margin: float) -> Tensor:
    """The source readout fell by at least `margin`."""
    return source_before - source_after >= margin


def transplanted(source_before: Tensor, source_after: Tensor, target_before: Tensor, target_after: Tensor) -> Tensor:
    """The target readout rose and the source readout fell."""
    return (target_after > target_before) & (source_after < source_before)


def swapped(source_before: Tensor, source_after: Tensor, target_before: Tensor, target_after: Tensor) -> Tensor:
    """The source-minus-target readout changed sign."""
    return (source_before - target_before) * (source_after - target_after) < 0

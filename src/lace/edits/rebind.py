"""The rebind edit: exchange two attributes between the two objects they are bound to.

Attenuate, swap and transplant act on a bag of concepts, so none of them can turn
"red square + blue circle" into "blue square + red circle": both hold the same concepts.
Rebind moves along compound ("<attribute> <object>") directions instead
(`lace.concepts.bindings`), batched over B embeddings x M edit slots:

- Which: two objects o1 != o2 and two attributes a1 != a2 of the same group, read from
  the embedding's code: objects strongly used (the `tau_use` rule), attributes strongly
  used too, or only present for a named edit; all four compounds must be known. Only the `REBIND_CANDIDATES` heaviest attributes and
  objects of each embedding take part, which bounds the work at (8 x 8)^2 quadruples.
- Who goes with whom: read from the embedding's centred direction c_hat with the
  compound readouts r = cos(c_hat, e[a o]): a1 is bound to o1 when
  r(a1 o1) + r(a2 o2) >= r(a1 o2) + r(a2 o1), else the objects are renamed so it is.
- Step: w (e[a2 o1] + e[a1 o2] - e[a1 o1] - e[a2 o2]), the binding interaction alone:
  each attribute and each object appears once with each sign, so their main effects
  cancel. w = strength x the mean code weight of a1 and a2, so a rebind is about as
  large as a transplant of one attribute.
- Effect check: the pairing readouts cross, r(a2 o1) + r(a1 o2) > r(a1 o1) + r(a2 o2).

The step is built from directions, not from the code, so the concept-arithmetic control
of a rebind is the rebind itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

REBIND_CANDIDATES = 8


@dataclass
class RebindPlan:
    """One proposed rebind per (B, M) slot, without gradient.

    proposed: (B, M) bool. attributes: (B, M, 2) long concepts (a1, a2); objects: (B, M, 2)
    long concepts (o1, o2), a1 read as bound to o1. compounds: (B, M, 4) long rows of the
    compound table for a1 o1, a2 o2 (bound now) and a2 o1, a1 o2 (bound after).
    step: (B, M, d), zero where nothing is proposed.
    """

    proposed: Tensor
    attributes: Tensor
    objects: Tensor
    compounds: Tensor
    step: Tensor


def binding_margin(centred: Tensor, compounds: Tensor, table: Tensor) -> Tensor:
    """r(a1 o1) + r(a2 o2) - r(a2 o1) - r(a1 o2) for unit directions centred (B, M, d) or
    (B, 1, d), compounds (B, M, 4) and the compound table (P, d): (B, M)."""
    readouts = (centred.unsqueeze(2) * table[compounds]).sum(-1)  # (B, M, 4)
    return readouts[..., 0] + readouts[..., 1] - readouts[..., 2] - readouts[..., 3]


# long: one batched tensor program over (B, S_a, S_a, S_o, S_o) quadruples whose steps share a dozen tensors
def plan_rebind(
    centred: Tensor,
    weights: Tensor,
    attribute_usable: Tensor,
    object_usable: Tensor,
    is_attribute: Tensor,
    is_object: Tensor,
    group_ids: Tensor,
    compound_index: Tensor,
    table: Tensor,
    n_edits: int,
    strength: float,
    draws: Tensor | None = None,
    named: tuple[int, int] | None = None,
) -> RebindPlan:
    """Plan M rebinds of each of B embeddings.

    centred: (B, d) c_hat; weights: (B, C) concept weights; attribute_usable,
    object_usable: (B, C) bool, the attributes and objects that may take part;
    is_attribute, is_object: (C,) bool; group_ids: (C,) long;
    compound_index: (C, C) long rows of table (P, d), -1 where a compound is unknown.
    draws: (B, M) uniform numbers in [0, 1), each choosing one of its embedding's valid
    quadruples uniformly; or None with `named` = (a1, a2) fixed attributes, where the
    object pair with the clearest binding (largest |margin|) is taken.
    """
    batch = weights.shape[0]
    device = weights.device
    n_concepts = weights.shape[1]  # candidates beyond the kind's own concepts are masked, not counted (no sync)
    if named is None:
        n_attributes = min(REBIND_CANDIDATES, n_concepts)
        attribute_score = torch.where(attribute_usable & is_attribute, weights, torch.full_like(weights, -float("inf")))
        top_attribute_weight, top_attributes = attribute_score.topk(n_attributes, dim=1)  # (B, S_a)
        attribute_ok = torch.isfinite(top_attribute_weight)
    else:
        top_attributes = torch.tensor(named, device=device).expand(batch, 2)
        attribute_ok = attribute_usable.gather(1, top_attributes)
        n_attributes = 2
    n_objects = min(REBIND_CANDIDATES, n_concepts)
    object_score = torch.where(object_usable & is_object, weights, torch.full_like(weights, -float("inf")))
    top_object_weight, top_objects = object_score.topk(n_objects, dim=1)  # (B, S_o)
    object_ok = torch.isfinite(top_object_weight)

    upper_a = torch.ones(n_attributes, n_attributes, dtype=torch.bool, device=device).triu(1)
    upper_o = torch.ones(n_objects, n_objects, dtype=torch.bool, device=device).triu(1)
    attribute_groups = group_ids[top_attributes]
    attribute_pairs = (attribute_ok.unsqueeze(2) & attribute_ok.unsqueeze(1) & upper_a
                       & (attribute_groups.unsqueeze(2) == attribute_groups.unsqueeze(1)))  # (B, S_a, S_a)
    object_pairs = object_ok.unsqueeze(2) & object_ok.unsqueeze(1) & upper_o  # (B, S_o, S_o)
    compounds = compound_index[top_attributes.unsqueeze(2), top_objects.unsqueeze(1)]  # (B, S_a, S_o)
    # readouts of the (at most 64) candidate compounds only, not of the whole table
    readouts = torch.einsum("bijd,bd->bij", table[compounds.clamp_min(0)], centred)  # (B, S_a, S_o)

    # quadruples (i1, i2, j1, j2): attributes at top positions i1 < i2, objects at j1 < j2
    def grid(values: Tensor, first: int, second: int) -> Tensor:
        """(B, S_a, S_o) -> (B, S_a, S_a, S_o, S_o) value at (attribute i_first, object j_second)."""
        shape = [batch, 1, 1, 1, 1]
        shape[first] = n_attributes
        shape[2 + second] = n_objects
        return values.view(shape)

    known = compounds >= 0
    valid = (attribute_pairs.view(batch, n_attributes, n_attributes, 1, 1)
             & object_pairs.view(batch, 1, 1, n_objects, n_objects)
             & grid(known, 1, 1) & grid(known, 2, 2) & grid(known, 2, 1) & grid(known, 1, 2))
    margin = grid(readouts, 1, 1) + grid(readouts, 2, 2) - grid(readouts, 2, 1) - grid(readouts, 1, 2)
    valid = valid.flatten(1)  # (B, Q)
    margin = margin.expand(batch, n_attributes, n_attributes, n_objects, n_objects).flatten(1)
    n_valid = valid.sum(1, keepdim=True)  # (B, 1)
    if draws is None:
        scores = torch.where(valid, margin.abs(), torch.full_like(margin, -float("inf")))
        choice = scores.argmax(-1, keepdim=True).expand(batch, n_edits)  # (B, M)
    else:
        # the k-th valid quadruple, k uniform: one draw per slot whatever the number of candidates
        rank = (draws * n_valid).floor().long().clamp_max((n_valid - 1).clamp_min(0))  # (B, M)
        choice = torch.searchsorted(valid.long().cumsum(1), rank + 1).clamp_max(valid.shape[1] - 1)
    proposed = (n_valid > 0).expand(batch, n_edits)

    i1, rest = choice // (n_attributes * n_objects * n_objects), choice % (n_attributes * n_objects * n_objects)
    i2, rest = rest // (n_objects * n_objects), rest % (n_objects * n_objects)
    j1, j2 = rest // n_objects, rest % n_objects
    # read the pairing off the embedding: rename the objects so that a1 is the one bound to o1
    crossed = margin.gather(1, choice) < 0
    j1, j2 = torch.where(crossed, j2, j1), torch.where(crossed, j1, j2)
    flat = compounds.clamp_min(0).flatten(1)  # (B, S_a * S_o)
    chosen = torch.stack([flat.gather(1, i * n_objects + j) for i, j in ((i1, j1), (i2, j2), (i2, j1), (i1, j2))], -1)
    chosen = torch.where(proposed.unsqueeze(-1), chosen, torch.zeros_like(chosen))  # (B, M, 4)
    attributes = torch.stack([top_attributes.gather(1, i1), top_attributes.gather(1, i2)], -1)  # (B, M, 2)
    objects = torch.stack([top_objects.gather(1, j1), top_objects.gather(1, j2)], -1)
    weight = strength * weights.gather(1, attributes.flatten(1)).view(batch, n_edits, 2).mean(-1)  # (B, M)
    directions = table[chosen]  # (B, M, 4, d)
    step = directions[..., 2, :] + directions[..., 3, :] - directions[..., 0, :] - directions[..., 1, :]
    step = step * (weight * proposed).unsqueeze(-1)
    return RebindPlan(proposed, attributes, objects, chosen, step)


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
    attributes, attribute_ok = _candidate_attributes(weights, attribute_usable & is_attribute, named)
    objects, object_ok = _top_candidates(weights, object_usable & is_object)
    compounds = compound_index[attributes.unsqueeze(2), objects.unsqueeze(1)]  # (B, S_a, S_o)
    attribute_pairs = _pairs(attribute_ok, group_ids[attributes])  # (B, S_a, S_a)
    valid, margin = _quadruples(centred, compounds, table, attribute_pairs, _pairs(object_ok))
    choice, proposed = _choose(valid, margin, n_edits, draws)
    i1, i2, j1, j2 = _unravel(choice, attributes.shape[1], objects.shape[1])
    # read the pairing off the embedding: rename the objects so that a1 is the one bound to o1
    crossed = margin.gather(1, choice) < 0
    j1, j2 = torch.where(crossed, j2, j1), torch.where(crossed, j1, j2)
    flat = compounds.clamp_min(0).flatten(1)  # (B, S_a * S_o)
    n_objects = objects.shape[1]
    chosen = torch.stack([flat.gather(1, i * n_objects + j) for i, j in ((i1, j1), (i2, j2), (i2, j1), (i1, j2))], -1)
    chosen = torch.where(proposed.unsqueeze(-1), chosen, torch.zeros_like(chosen))  # (B, M, 4)
    chosen_attributes = torch.stack([attributes.gather(1, i1), attributes.gather(1, i2)], -1)  # (B, M, 2)
    chosen_objects = torch.stack([objects.gather(1, j1), objects.gather(1, j2)], -1)
    batch = weights.shape[0]
    weight = strength * weights.gather(1, chosen_attributes.flatten(1)).view(batch, n_edits, 2).mean(-1)  # (B, M)
    directions = table[chosen]  # (B, M, 4, d)
    step = directions[..., 2, :] + directions[..., 3, :] - directions[..., 0, :] - directions[..., 1, :]
    step = step * (weight * proposed).unsqueeze(-1)
    return RebindPlan(proposed, chosen_attributes, chosen_objects, chosen, step)


def _top_candidates(weights: Tensor, usable: Tensor) -> tuple[Tensor, Tensor]:
    """The `REBIND_CANDIDATES` heaviest usable concepts of each row, (B, S) long, and which are real, (B, S) bool.

    Candidates beyond the usable concepts are masked, not counted (no sync)."""
    score = torch.where(usable, weights, torch.full_like(weights, -float("inf")))
    top_weight, top = score.topk(min(REBIND_CANDIDATES, weights.shape[1]), dim=1)
    return top, torch.isfinite(top_weight)


def _candidate_attributes(weights: Tensor, usable: Tensor, named: tuple[int, int] | None) -> tuple[Tensor, Tensor]:
    """The attributes taking part, (B, S_a), and which may: the heaviest, or the two `named` ones where usable."""
    if named is None:
        return _top_candidates(weights, usable)
    attributes = torch.tensor(named, device=weights.device).expand(weights.shape[0], 2)
    return attributes, usable.gather(1, attributes)


def _pairs(ok: Tensor, groups: Tensor | None = None) -> Tensor:
    """(B, S, S) bool: pairs i < j of candidates that may take part, ok (B, S), and are of one group, (B, S) ids."""
    upper = torch.ones(ok.shape[1], ok.shape[1], dtype=torch.bool, device=ok.device).triu(1)
    pairs = ok.unsqueeze(2) & ok.unsqueeze(1) & upper
    return pairs if groups is None else pairs & (groups.unsqueeze(2) == groups.unsqueeze(1))


def _quadruples(centred: Tensor, compounds: Tensor, table: Tensor, attribute_pairs: Tensor,
                object_pairs: Tensor) -> tuple[Tensor, Tensor]:
    """Every quadruple (i1, i2, j1, j2), attributes at top positions i1 < i2 and objects at j1 < j2, flattened:
    (B, Q) bool valid (both pairs allowed and all four compounds known) and (B, Q) binding margin.

    attribute_pairs, object_pairs: (B, S_a, S_a) and (B, S_o, S_o) bool, the pairs that may take part (`_pairs`)."""
    batch, n_attributes, n_objects = compounds.shape
    # readouts of the (at most 64) candidate compounds only, not of the whole table
    readouts = torch.einsum("bijd,bd->bij", table[compounds.clamp_min(0)], centred)  # (B, S_a, S_o)

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
    return valid.flatten(1), margin.expand(batch, n_attributes, n_attributes, n_objects, n_objects).flatten(1)


def _choose(valid: Tensor, margin: Tensor, n_edits: int, draws: Tensor | None) -> tuple[Tensor, Tensor]:
    """The quadruple of each of (B, M) slots, (B, M) long, and whether one was proposed, (B, M) bool: the k-th
    valid one for uniform `draws` (one draw per slot whatever the number of candidates), else the clearest."""
    batch = valid.shape[0]
    n_valid = valid.sum(1, keepdim=True)  # (B, 1)
    if draws is None:
        scores = torch.where(valid, margin.abs(), torch.full_like(margin, -float("inf")))
        choice = scores.argmax(-1, keepdim=True).expand(batch, n_edits)  # (B, M)
    else:
        rank = (draws * n_valid).floor().long().clamp_max((n_valid - 1).clamp_min(0))  # (B, M)
        choice = torch.searchsorted(valid.long().cumsum(1), rank + 1).clamp_max(valid.shape[1] - 1)
    return choice, (n_valid > 0).expand(batch, n_edits)


def _unravel(choice: Tensor, n_attributes: int, n_objects: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flat quadruple indices (B, M) -> their positions (i1, i2, j1, j2) among the candidates."""
    i1, rest = choice // (n_attributes * n_objects * n_objects), choice % (n_attributes * n_objects * n_objects)
    i2, rest = rest // (n_objects * n_objects), rest % (n_objects * n_objects)
    return i1, i2, rest // n_objects, rest % n_objects

"""Fidelity of the pooled-embedding arms' image-side counterfactuals against the rendered ones.

The same items and figures as the local edits of `lace.experiment.fidelity`, for edits made on the
pooled image embedding u (N, d) instead of inside the tower:
- paired_caption_directions (AHNPL-style, `lace.train.negatives.paired_caption_directions`):
  u_edit = normalise(u + v(t') - v(t)), t the item's caption and t' its negative caption (the
  colour-swapped caption of a swap_attribute item, the recoloured one of a replace_attribute item);
- lace: the labelled dictionary's targeted edit, the one the rendered image shows: a swap of the
  two colours a swap_attribute item exchanges, a transplant of the old colour to the new one for a
  replace_attribute item (`CounterfactualEditor.counterfactuals` with `EditConfig(kinds=(kind,),
  target="source=target")`, every other knob at its default, effect check included);
- concept_arithmetic: the same edits, same step sizes, along plain concept directions.
Colour names come from the item's edit and its scene. The control of each edit is a random step
of the edit's size |u_edit - u| in embedding space, then normalised. Rows the editor cannot edit
(a colour owning no aligned atom, a source not strongly used, a swap of near-equal weights, a
failed effect check) count as invalid in `valid_share`; pairs it refuses outright are listed, and
`invalid_shares` splits the invalid rows by reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lace.concepts.labelled import LabelledDictionary
from lace.edits import EditConfig, build_editor
from lace.edits.controls import random_step
from lace.errors import LaceInputError, input_error
from lace.local.fidelity_scores import family_figures
from lace.train.negatives import check_editor_dimension, paired_caption_directions

POOLED_METHODS = ("paired_caption_directions", "lace", "concept_arithmetic")
"""Pooled-embedding arms measured beside the local edits."""
DICTIONARY_METHODS = ("lace", "concept_arithmetic")
"""The arms that need the labelled concept dictionary."""
EDIT_KIND_OF_FAMILY = {"swap_attribute": "swap", "replace_attribute": "transplant"}
"""The dictionary edit that makes each benchmark family's rendered change."""


def check_pooled(pooled: tuple[str, ...], dictionary: str | None, where: str = "FidelityConfig") -> None:
    """Refuse unknown pooled arms, and dictionary arms without a dictionary folder."""
    unknown = [name for name in pooled if name not in POOLED_METHODS]
    if unknown:
        raise input_error(where, "pooled", f"names from {list(POOLED_METHODS)}", unknown)
    needing = [name for name in pooled if name in DICTIONARY_METHODS]
    if needing and not dictionary:
        raise input_error(where, "dictionary", f"a labelled dictionary folder (`lace dict fit`) for {needing}",
                          dictionary)


def item_colour_pairs(items: list[dict], scenes: dict[str, dict], family: str) -> list[tuple[str, str]]:
    """(source, target) colour of each item's edit: the two exchanged colours of a swap_attribute
    item (objects i, j of its scene), the old and new colour of a replace_attribute item."""
    pairs = []
    for item in items:
        edit = item["edit"]
        if family == "swap_attribute":
            first, second = edit["objects"]
            objects = scenes[item["scene_id"]]["objects"]
            pairs.append((objects[first]["colour"], objects[second]["colour"]))
        else:
            pairs.append((edit["from"], edit["to"]))
    return pairs


def paired_caption_edit(u: Tensor, v_pos: Tensor, v_neg: Tensor) -> Tensor:
    """normalise(u + v_neg - v_pos), (N, d), from unit embeddings (N, d) of images and both captions."""
    return paired_caption_directions(u, v_pos, v_neg[:, None])[:, 0]


def embedding_random_step(step: Tensor, generator: torch.Generator) -> Tensor:
    """Random directions (N, d) with the norms of `step` (N, d)."""
    return random_step(step[:, None], step.norm(dim=-1)[:, None], generator)[:, 0]


def targeted_dictionary_edits(labelled: LabelledDictionary, u: Tensor, kind: str, pairs: list[tuple[str, str]],
                              arithmetic: bool, seed: int) -> tuple[Tensor, Tensor, Tensor, dict[str, str]]:
    """The editor's `kind` edit ("swap" or "transplant") of each row's colour pair, on image embeddings u (N, d).

    Returns u_edit (N, d) (u itself on invalid rows), valid (N,), proposed (N,) (the editor found
    the edit feasible, before its effect check) and, for pairs the editor refuses outright,
    "source=target" -> its reason.
    """
    u_edit, refused = u.clone(), {}
    valid, proposed = torch.zeros(len(u), dtype=torch.bool), torch.zeros(len(u), dtype=torch.bool)
    for pair in sorted(set(pairs)):
        rows = torch.tensor([row for row, other in enumerate(pairs) if other == pair])
        name = f"{pair[0]}={pair[1]}"
        if pair[0] == pair[1]:
            refused[name] = "the two colours are the same"
            continue
        try:
            editor = build_editor(labelled, EditConfig(kinds=(kind,), target=name))
        except LaceInputError as error:
            refused[name] = str(error)
            continue
        check_editor_dimension(editor, u.shape[1], "FidelityConfig.dictionary")
        make = editor.concept_arithmetic if arithmetic else editor.counterfactuals
        edited = make(u[rows], "image", 1, torch.Generator().manual_seed(seed))
        u_edit[rows], valid[rows] = edited.embeddings[:, 0], edited.valid[:, 0]
        proposed[rows] = edited.records.proposed[:, 0]
    return u_edit, valid, proposed, refused


def invalid_shares(pairs: list[tuple[str, str]], refused: dict[str, str], proposed: Tensor, valid: Tensor) -> dict:
    """Shares of all rows (N,) invalid because the pair was refused, no edit was proposed (a colour
    not strongly used, or two near-equal weights), or the proposed edit failed its effect check."""
    was_refused = torch.tensor([f"{source}={target}" in refused for source, target in pairs])
    return {"refused_pair": float(was_refused.float().mean()),
            "not_proposed": float((~was_refused & ~proposed).float().mean()),
            "failed_effect_check": float((proposed & ~valid).float().mean())}


def measure_pooled(pooled: tuple[str, ...], labelled: LabelledDictionary | None, families: dict[str, list[dict]],
                   scenes: dict[str, dict], data: dict[str, dict[str, Tensor]], seed: int, log=print) -> dict:
    """{arm: {"swap" | "transplant": figures}} for the pooled arms on the families' items.

    data[family]: "u", "u_rendered", "v_pos", "v_neg" unit embeddings (N, d) of the items `families[family]`.
    """
    generator = torch.Generator().manual_seed(seed)
    results = {}
    for method in pooled:
        results[method] = {}
        for family, kind in EDIT_KIND_OF_FAMILY.items():
            embeddings = data[family]
            u = embeddings["u"]
            refused, reasons = {}, {}
            if method == "paired_caption_directions":
                u_edit = paired_caption_edit(u, embeddings["v_pos"], embeddings["v_neg"])
                valid = (embeddings["v_neg"] - embeddings["v_pos"]).norm(dim=-1) > 0
            else:
                pairs = item_colour_pairs(families[family], scenes, family)
                u_edit, valid, proposed, refused = targeted_dictionary_edits(labelled, u, kind, pairs,
                                                                             method == "concept_arithmetic", seed)
                reasons = invalid_shares(pairs, refused, proposed, valid)
            step = u_edit - u
            u_control = F.normalize(u + embedding_random_step(step, generator), dim=-1)
            figures = family_figures(embeddings, valid, u_edit, u_control, step.norm(dim=-1))
            figures["refused_pairs"] = refused
            figures["invalid_shares"] = reasons
            results[method][kind] = figures
            log(f"[pooled {method}] {kind} valid {figures['valid_share']} edit {figures['edit']} "
                f"control {figures['random_control']['direction_agreement']}")
    return results

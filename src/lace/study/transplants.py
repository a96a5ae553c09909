"""Edit retrieval on real photographs: transplant A -> B in test image embeddings and
look at the nearest real test images, against random and concept-arithmetic edits of
the same size."""

from __future__ import annotations

import torch

from lace.concepts.labelled import LabelledDictionary
from lace.edits import EditConfig
from lace.errors import LaceInputError
from lace.eval.dictionary_diagnostics import transplant_editor, transplant_edits
from lace.eval.edit_retrieval import caption_concepts, edit_retrieval
from lace.eval.neighbours import topk_neighbours
from lace.study.features import SplitFeatures


@torch.no_grad()
def transplant_retrieval(
    labelled: LabelledDictionary, test_images: torch.Tensor, test: SplitFeatures, rules,
    pairs: tuple[tuple[str, str], ...], strengths: tuple[float, ...], k: int = 10, seed: int = 0,
) -> list[dict]:
    """One row per (source, target, strength): shares of the k nearest test images whose
    captions name the target (`*/target`) and that keep the source image's other concepts
    (`*/keep`: concepts named by at least 3 of its 5 captions), for the transplant and
    its two controls, with the number of edited images and the mean edit angle."""
    named_any, names = caption_concepts(test.captions_per_image, rules, 1)  # (N_img, C)
    named_often, _ = caption_concepts(test.captions_per_image, rules, 3)
    column = {name: i for i, name in enumerate(names)}
    rows = []
    for source, target in pairs:
        base = {"source": source, "target": target}
        missing = [c for c in (source, target) if c not in labelled.directions or c not in column]
        if missing:
            rows.extend({**base, "strength": s, "skipped": f"no concept direction or caption match for {missing}"}
                        for s in strengths)
            continue
        shown = named_any[:, column[source]]
        for strength in strengths:
            pair = f"{source}={target}"
            try:
                edits = transplant_edits(transplant_editor(labelled, pair, EditConfig(strength=strength)),
                                         test_images, pair, seed)
            except LaceInputError as error:  # e.g. a concept owning no aligned atom: reported, not hidden
                rows.append({**base, "strength": strength, "skipped": str(error)})
                continue
            edited = edits["transplant"]
            usable = (edited.valid[:, 0].cpu() & shown).nonzero().squeeze(1)
            row = {**base, "strength": strength, "n_source_images": int(shown.sum()), "n_edited": int(usable.numel()),
                   "target_base_rate": float(named_any[:, column[target]].float().mean())}
            if usable.numel():
                keep = named_often[usable].clone()
                keep[:, column[source]] = False
                keep[:, column[target]] = False
                row.update(edit_retrieval(
                    test_images[usable], {name: made.embeddings[usable, 0] for name, made in edits.items()},
                    test_images, named_any, torch.full((usable.numel(),), column[target]), keep=keep,
                    source_rows=usable, k=k))
                if strength == max(strengths):
                    row["example"] = _example(labelled, test_images, edited.embeddings[:, 0], int(usable[0]), test)
            rows.append(row)
    return rows


def _example(labelled: LabelledDictionary, test_images: torch.Tensor, edited: torch.Tensor, row: int,
             test: SplitFeatures, n_neighbours: int = 5) -> dict:
    """One edited test image: its codes before and after, and its nearest real images after."""
    before = labelled.dictionary.transform(test_images[row:row + 1], "image", dense=True)[0]
    after = labelled.dictionary.transform(edited[row:row + 1], "image", dense=True)[0]
    neighbours = topk_neighbours(edited[row:row + 1], test_images, n_neighbours + 1).indices[0].tolist()
    neighbours = [i for i in neighbours if i != row][:n_neighbours]
    return {"image_path": test.image_paths[row], "codes_before": before.tolist(), "codes_after": after.tolist(),
            "neighbour_paths": [test.image_paths[i] for i in neighbours],
            "neighbour_captions": [test.captions_per_image[i][0] for i in neighbours]}

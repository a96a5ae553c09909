"""VALSE (Parcalabescu et al., ACL 2022): captions against linguistically made foils.

Layout of the release (github.com/Heidelberg-NLP/VALSE, `data/*.json`): one JSON file
per piece (existence.json, plurals.json, counting-hard.json, counting-small-quant.json,
counting-adversarial.json, relations.json, action-replacement.json, actant-swap.json,
coreference-standard.json, coreference-hard.json, foil-it.json), each a dict
id -> {"image_file", "dataset", "caption", "foil", "mturk": {"caption", "foil", "other"}, ...}.
`caption` is a string in the published files; a list is also read, taking its first
entry as the authors' `lxmert_valse_eval.py` does (`caption[0]`). `foil` is one string.
Images live under an image folder, as `<images>/<image_file>` or
`<images>/<dataset>/<image_file>` (each piece comes from another source dataset).

Scoring follows the authors' scripts (`lxmert_valse_eval.py`, `unimodal_valse_eval.py`):
only items that at least two of three annotators validated, `mturk["caption"] >= 2`, are
scored (`all_items=True` keeps every item); the figure per piece is pairwise accuracy,
the caption scoring strictly above the foil (a tie is a failure), and `mean` is the mean
over pieces, as in the paper's tables.
"""

from __future__ import annotations

from pathlib import Path

from lace.errors import LaceInputError
from lace.eval.benchmarks.base import (
    Benchmark,
    item_field,
    register_benchmark,
    text_field,
)
from lace.eval.benchmarks.pairs import PairItems, pair_scores
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import pairwise_accuracy
from lace.io import read_json

VALIDATED_VOTES = 2  # the authors' filter: mturk["caption"] >= 2 of 3 annotators


@register_benchmark("valse")
class VALSE(Benchmark):
    published_at = "github.com/Heidelberg-NLP/VALSE"
    image_folder_flag = "--valse-images"

    def load(self, root: str | Path, image_root: str | Path | None = None, all_items: bool = False
             ) -> dict[str, PairItems]:
        """Pieces (file stems) -> their (image, caption, foil) items; annotator-validated items
        only unless `all_items`."""
        root = Path(root)
        image_root = Path(image_root) if image_root is not None else root / "images"
        files = sorted(root.glob("*.json"))
        if not files:
            raise LaceInputError(f"valse: no JSON files (e.g. 'existence.json') found in {root}; "
                                 f"the original is published at {self.published_at} (data/)")
        data = {}
        for path in files:
            items = read_json(path, dict, "a JSON object of id -> item")
            pairs = PairItems()
            for key, item in items.items():
                if not all_items and _caption_votes(item, path, key) < VALIDATED_VOTES:
                    continue
                image = _resolve_image(image_root, text_field(item, "image_file", path, key), item.get("dataset"))
                pairs.image_paths.append(str(image))
                pairs.captions.append(_caption(item, path, key))
                pairs.negatives.append(text_field(item, "foil", path, key))
            data[path.stem] = self.usable(path.stem, pairs, [[image] for image in pairs.image_paths])
        return data

    def score(self, cache: EmbeddingCache, data: dict[str, PairItems]) -> dict[str, float]:
        figures = {name: pairwise_accuracy(*pair_scores(cache, pairs)) for name, pairs in data.items() if pairs.captions}
        figures["mean"] = sum(figures.values()) / len(figures) if figures else float("nan")
        return figures


def _caption(item: dict, path: Path, key: str) -> str:
    caption = item_field(item, "caption", path, key)
    if isinstance(caption, list) and caption:
        caption = caption[0]
    if not isinstance(caption, str) or not caption.strip():
        raise LaceInputError(f"{path}: item {key}: field 'caption': expected a non-empty string or a list of "
                             f"strings (got {caption!r})")
    return caption


def _caption_votes(item: dict, path: Path, key: str) -> int:
    votes = item_field(item, "mturk", path, key)
    count = votes.get("caption") if isinstance(votes, dict) else None
    if not isinstance(count, int):
        raise LaceInputError(f"{path}: item {key}: field 'mturk': expected annotator votes "
                             f"{{'caption': int, ...}} (got {votes!r}); pass all_items to score unvalidated files")
    return count


def _resolve_image(image_root: Path, image_file: str, dataset: object) -> Path:
    direct = image_root / image_file
    if direct.is_file() or not isinstance(dataset, str):
        return direct
    nested = image_root / dataset / image_file
    return nested if nested.is_file() else direct

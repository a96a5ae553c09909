"""Cost of a LACE training step over a plain CLIP step: same model, same batch, one process.

For each setting (the tiny world model at batch 128, a random-init ViT-B-32 at a small
batch) it times, interleaved so that machine load hits both alike:
- plain: forward, CLIP loss, backward, AdamW step;
- lace: the same plus M counterfactual edits of every caption and image embedding
  (the real `CounterfactualEditor`, a dictionary fitted on random embeddings) and the
  LACE loss with the extra columns.
Parts of the LACE step are timed on their own: sparse coding + edits (both sides) and
the extra logits (LACE loss minus CLIP loss, forward). Median over repeats.
A third setting times LACE-local the way `lace train` runs it: the demo's lace-micro-rn-32 at
batch 128 on drawn world scenes, plain against plain + M local image negatives at layer L
(`build_local_editor`, `LocalImagePass`), interleaved with its floor: the same step with M unedited
copies of each map in place of the edited ones (what the extra upper-layer maps cost without any editing).
The same setting times the pairs layout (`lace.train.pairs`): each edit a row of its own with the caption
it describes (written by the rule editor, encoded in a second text pass), alone and as the arm that ships
("LACE-local pairs + real-image negative": the column too, and the real image a negative of the edit's caption).
Last line: one JSON object.

    PYTHONPATH=src python benchmarks/train_step.py [--repeats 5] [--threads 1] [--local-n-edits 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from local_negatives import world_batch

from lace.concepts.directions import directions_from_templates
from lace.concepts.labelling import label_atoms
from lace.concepts.vocabulary import load_vocabulary
from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.distributed import DistributedContext
from lace.edits import CounterfactualEditor
from lace.edits.captions import RuleNegatives
from lace.encoders import load_encoder
from lace.local import LocalEditConfig, build_local_editor
from lace.local.towers import ImageTowerSplit
from lace.losses import clip_loss, lace_loss
from lace.train.config import train_config
from lace.train.local_arm import LocalImagePass
from lace.train.optim import build_optimizer
from lace.train.pairs import EditedImages, describe_slots, pair_rows, pair_term

# world_batch (benchmarks/local_negatives.py) draws world scenes on the fly
VOCABULARY = "src/lace/data/world/vocabulary.yaml"


def make_editor(encoder, n_atoms: int, sparsity: int, seed: int = 0) -> CounterfactualEditor:
    """A dictionary fitted on random unit embeddings, labelled with the world vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    d = encoder.embed_dim
    images = F.normalize(torch.randn(2048, d, generator=generator), dim=-1)
    texts = F.normalize(torch.randn(2048, d, generator=generator), dim=-1)
    dictionary = ConceptDictionary(n_atoms=n_atoms, sparsity=sparsity, batch_size=1024).fit(images, texts)
    with torch.no_grad():
        directions = directions_from_templates(load_vocabulary(VOCABULARY), encoder.encode_texts, dictionary.mean_text_)
    # Stand in for a dictionary of real embeddings: make the first atoms the concept directions, so
    # that edits are proposed (on random atoms almost none would be, and the edit step would be idle).
    dictionary.atoms_[: len(directions)] = directions.directions
    labelling = label_atoms(dictionary, directions, images, texts, tau_align=0.3)
    return CounterfactualEditor(dictionary, labelling, directions)


def time_setting(name: str, model: str, batch: int, n_edits: int, repeats: int, n_atoms: int, sparsity: int) -> dict:
    torch.manual_seed(0)
    encoder = load_encoder(model, None)
    editor = make_editor(encoder, n_atoms, sparsity)
    size = encoder.model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    pixels = torch.randn(batch, 3, size, size)
    tokens = encoder.tokenize([f"a red circle left of a blue square number {i}" for i in range(batch)])
    optimizer = build_optimizer(encoder, 1e-5, 0.1, (0.9, 0.98), 1e-6)
    generator = torch.Generator()
    parts: dict[str, list[float]] = {"plain": [], "lace": [], "edits": [], "extra_logits": []}
    valid_share = []

    def step(lace: bool) -> None:
        start = time.perf_counter()
        U, V, scale = encoder(pixels, tokens)
        if lace:
            generator.manual_seed(len(parts["lace"]))
            edit_start = time.perf_counter()
            captions = editor.counterfactuals(V, "text", n_edits, generator=generator)
            images = editor.counterfactuals(U, "image", n_edits, generator=generator)
            parts["edits"].append(time.perf_counter() - edit_start)
            valid_share.append(float(torch.cat([captions.valid, images.valid]).float().mean()))
            with torch.no_grad():
                loss_start = time.perf_counter()
                clip_loss(U, V, scale)
                plain_seconds = time.perf_counter() - loss_start
                loss_start = time.perf_counter()
                lace_loss(U, V, scale, captions.embeddings, captions.valid, images.embeddings, images.valid)
                parts["extra_logits"].append(time.perf_counter() - loss_start - plain_seconds)
            loss = lace_loss(U, V, scale, captions.embeddings, captions.valid, images.embeddings, images.valid)
        else:
            loss = clip_loss(U, V, scale)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        parts["lace" if lace else "plain"].append(time.perf_counter() - start)

    step(False)
    step(True)  # warm-up
    for values in parts.values():
        values.clear()
    valid_share.clear()
    for _ in range(repeats):
        step(False)
        step(True)
    median = {key: statistics.median(values) for key, values in parts.items()}
    return {
        "setting": name, "model": model, "batch": batch, "n_edits": n_edits,
        "plain_ms": 1e3 * median["plain"], "lace_ms": 1e3 * median["lace"],
        "edits_ms": 1e3 * median["edits"], "extra_logits_ms": 1e3 * median["extra_logits"],
        "valid_edit_share": statistics.mean(valid_share),
        "lace_over_plain": median["lace"] / median["plain"],
        # Less noisy on a loaded machine: the plain step plus the separately timed LACE parts
        # (backward through the edits not included).
        "parts_over_plain": (median["plain"] + median["edits"] + median["extra_logits"]) / median["plain"],
    }


def time_local(n_edits: int, repeats: int, layer: str, batch: int = 128, fit_images: int = 1000,
               pretrained: str | None = None) -> dict:
    """Plain step against the LACE-local step of `lace train` (image negatives only), interleaved."""
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32", pretrained)
    normalise = encoder.preprocess.transforms[-1]
    raw, captions, vocabulary = world_batch(fit_images + batch)
    pixels = normalise(raw)
    config = train_config(local_image_negatives=True, local=LocalEditConfig(layer=layer, n_edits=n_edits),
                         vocabulary="world")
    started = time.perf_counter()
    editor = build_local_editor(config.negatives.local, encoder.model, pixels[:fit_images],
                                [[c] for c in captions[:fit_images]], normalise, vocabulary, seed=config.run.seed)
    fit_seconds = time.perf_counter() - started
    pixels, tokens = pixels[fit_images:], encoder.tokenize(captions[fit_images:])
    rules, batch_captions = RuleNegatives(vocabulary), captions[fit_images:]
    one_process = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    pair_share = []
    optimizer = build_optimizer(encoder, 1e-5, 0.1, (0.9, 0.98), 1e-6)
    seeds = list(range(batch))
    valid = []
    encoder.train()
    split = ImageTowerSplit(encoder.model, layer)

    def unedited_copies(pixels: torch.Tensor) -> torch.Tensor:
        """The floor of the local pass: the upper layers on the maps and M unedited copies, no editing."""
        features = split.lower(pixels)
        embeddings = split.upper(features.repeat(1 + n_edits, 1, 1), reference_rows=batch)
        unedited_copies.negatives = embeddings[batch:].reshape(n_edits, batch, -1).transpose(0, 1)
        return embeddings[:batch]

    def step(kind: str) -> None:
        start = time.perf_counter()
        if kind == "local":  # as `lace train` runs it: U and the negatives from one pass of the image tower
            image_pass = LocalImagePass(editor, encoder.model, n_edits, seeds)
            U, V, scale = encoder(pixels, tokens, encode_images=image_pass)
            valid.append(float(image_pass.valid.float().mean()))
            loss = lace_loss(U, V, scale, image_negatives=image_pass.negatives, image_valid=image_pass.valid)
        elif kind in ("pairs", "pairs + column"):  # as `lace train` runs the pairs layout
            image_pass = LocalImagePass(editor, encoder.model, n_edits, seeds)
            U, V, scale = encoder(pixels, tokens, encode_images=image_pass)
            edits = EditedImages(image_pass.negatives, image_pass.valid,
                                 describe_slots(rules, batch_captions, image_pass.changes))
            rows = pair_rows([edits], encoder.encode_texts)
            pair_share.append(float(rows.valid.any(dim=1).float().mean()))
            column = kind == "pairs + column"
            loss = lace_loss(U, V, scale, image_negatives=image_pass.negatives if column else None,
                             image_valid=image_pass.valid if column else None)
            # the arm that ships (docs/results.md): with the column, the real image also a negative of T'
            loss = loss + pair_term(rows, U, V, scale, None, one_process, real_image_negative=column)
        elif kind == "floor":
            U, V, scale = encoder(pixels, tokens, encode_images=unedited_copies)
            loss = lace_loss(U, V, scale, image_negatives=unedited_copies.negatives,
                             image_valid=torch.ones(batch, n_edits, dtype=torch.bool))
        else:
            U, V, scale = encoder(pixels, tokens)
            loss = clip_loss(U, V, scale)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times[kind].append(time.perf_counter() - start)

    kinds = ("plain", "local", "floor", "pairs", "pairs + column")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up
        step(kind)
    times = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind in kinds:
            step(kind)
    plain, local, floor, pairs, pairs_column = (statistics.median(times[kind]) for kind in kinds)
    return {"setting": "world micro-rn, LACE-local", "model": "lace-micro-rn-32", "batch": batch, "n_edits": n_edits,
            "layer": layer, "plain_ms": 1e3 * plain, "local_ms": 1e3 * local, "local_over_plain": local / plain,
            # the same step with the edits left out: the upper layers' extra maps alone
            "floor_ms": 1e3 * floor, "floor_over_plain": floor / plain,
            "pairs_ms": 1e3 * pairs, "pairs_over_plain": pairs / plain,
            "pairs_column_ms": 1e3 * pairs_column, "pairs_column_over_plain": pairs_column / plain,
            "pair_row_share": statistics.mean(pair_share),
            "valid_edit_share": statistics.mean(valid), "editor_fit_seconds": fit_seconds, "fit_images": fit_images}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-edits", type=int, default=4)
    parser.add_argument("--vit-batch", type=int, default=8)
    parser.add_argument("--local-n-edits", type=int, default=2)
    parser.add_argument("--local-layer", default="layer1")
    parser.add_argument("--local-pretrained", default=None, help="checkpoint of lace-micro-rn-32 (e.g. the demo's base)")
    parser.add_argument("--local-only", action="store_true", help="time only the LACE-local setting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [] if args.local_only else [
        time_setting("world tiny", "lace-tiny", 128, args.n_edits, args.repeats, n_atoms=128, sparsity=6),
        time_setting("ViT-B-32 random init", "ViT-B-32", args.vit_batch, args.n_edits, args.repeats,
                     n_atoms=512, sparsity=8),
    ]
    print(f"{'setting':<22} {'batch':>5} {'plain ms':>9} {'lace ms':>9} {'edits ms':>9} {'extra logits ms':>16} "
          f"{'valid':>6} {'lace/plain':>10} {'parts/plain':>11}")
    for r in rows:
        print(f"{r['setting']:<22} {r['batch']:>5} {r['plain_ms']:>9.1f} {r['lace_ms']:>9.1f} {r['edits_ms']:>9.1f} "
              f"{r['extra_logits_ms']:>16.2f} {r['valid_edit_share']:>6.2f} {r['lace_over_plain']:>10.3f} "
              f"{r['parts_over_plain']:>11.3f}")
    local = time_local(args.local_n_edits, args.repeats, args.local_layer, pretrained=args.local_pretrained)
    print(f"{local['setting']:<22} {local['batch']:>5} {local['plain_ms']:>9.1f} local {local['local_ms']:.1f} ms "
          f"(M = {local['n_edits']} at {local['layer']}; valid {local['valid_edit_share']:.2f}) "
          f"local/plain {local['local_over_plain']:.3f} (floor, no edits: {local['floor_over_plain']:.3f}); "
          f"editor fit {local['editor_fit_seconds']:.1f}s")
    print(f"{'pairs layout':<22} {local['batch']:>5} pairs {local['pairs_ms']:.1f} ms, pairs/plain "
          f"{local['pairs_over_plain']:.3f}; shipped (+ column, real-image negative) {local['pairs_column_ms']:.1f} ms, "
          f"shipped/plain {local['pairs_column_over_plain']:.3f} (rows with a written caption "
          f"{local['pair_row_share']:.2f})")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    if torch.cuda.is_available():
        peak_gb = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps({
        "benchmark": "train_step", "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": args.threads, "settings": rows, "local": local,
        "local_over_plain": local["local_over_plain"], "pairs_over_plain": local["pairs_over_plain"],
        "pairs_column_over_plain": local["pairs_column_over_plain"],
        "shipped_arm": "LACE-local pairs + real-image negative", "shipped_over_plain": local["pairs_column_over_plain"],
        "lace_over_plain": max((r["lace_over_plain"] for r in rows), default=None), "peak_gb": round(peak_gb, 3),
    }))


if __name__ == "__main__":
    main()

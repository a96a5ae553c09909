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
it describes (written by the rule editor, encoded in a second text pass), alone, with
the column too and the real image a negative of the edit's caption ("LACE-local pairs + real-image negative"),
that arm with only a share of each batch's rows edited (`--local-edit-share`, `LocalEditConfig.edit_share`), and
the arm that ships (`lace.experiment.variants.CHOSEN_BEST`: the same with artefact-symmetric round-trip
counterparts, `local.symmetric`, every row edited), with its floor: the same passes with no editing (the upper
layers on 1 + 2M unedited copies of each map, the text tower on M copies of each real caption as well).
`--parts` also times the arm that ships part by part (forward parts one by one, the backward whole, and pieces
alone, forward and backward).
Last line: one JSON object; `lace_over_plain` names every arm timed, over its setting's plain step;
`vs_peer_ratio` is the arm that ships over plain, `vs_floor_ratio` over its floor.

    PYTHONPATH=src python benchmarks/train_step.py [--repeats 5] [--threads 1] [--local-n-edits 2] [--parts]
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
from lace.experiment.variants import CHOSEN_BEST
from lace.local import LocalEditConfig, build_local_editor
from lace.local.editor import slot_changes
from lace.local.symmetric import counterpart_steps, real_stand_ins
from lace.local.towers import ImageTowerSplit
from lace.losses import clip_loss, lace_loss
from lace.row_random import RowGenerators
from lace.train.config import train_config
from lace.train.local_arm import LocalImagePass
from lace.train.optim import build_optimizer
from lace.train.pairs import EditedImages, PairRows, describe_slots, pair_rows, pair_term

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


CANDIDATE_EDIT_SHARE = 0.25
"""The share of rows the cheaper candidate of "LACE-local pairs + real-image negative" edits
(`LocalEditConfig.edit_share`; validation against every row edited: docs/local_edits.md#cost)."""
LOCAL_ARMS = {"local": "LACE-local", "floor": "LACE-local floor (upper layers on unedited copies)",
              "pairs": "LACE-local pairs", "real_negative": "LACE-local pairs + real-image negative",
              "real_negative, share": "LACE-local pairs + real-image negative, a share of the rows edited",
              "shipped": CHOSEN_BEST,
              "shipped floor": f"{CHOSEN_BEST} floor (its tower passes on unedited copies, no editing)"}
"""The LACE-local setting's steps by kind, as the JSON line names them (besides "plain"); "shipped" is the arm that
ships (`CHOSEN_BEST`, the round-trip symmetric pairs)."""


class LocalSetting:
    """The LACE-local setting: the demo's model (a trained base with `pretrained`), an editor fitted on
    `fit_images` drawn world scenes, and a batch of `batch` more, with their captions and the rule editor."""

    def __init__(self, n_edits: int, layer: str, batch: int = 128, fit_images: int = 1000,
                 pretrained: str | None = None):
        torch.manual_seed(0)
        self.encoder = encoder = load_encoder("lace-micro-rn-32", pretrained)
        normalise = encoder.preprocess.transforms[-1]
        raw, captions, vocabulary = world_batch(fit_images + batch)
        pixels = normalise(raw)
        config = train_config(local_image_negatives=True, local=LocalEditConfig(layer=layer, n_edits=n_edits),
                              vocabulary="world")
        started = time.perf_counter()
        self.editor = build_local_editor(config.negatives.local, encoder.model, pixels[:fit_images],
                                         [[c] for c in captions[:fit_images]], normalise, vocabulary, seed=config.run.seed)
        self.fit_seconds = time.perf_counter() - started
        self.pixels, self.captions = pixels[fit_images:], captions[fit_images:]
        self.tokens = encoder.tokenize(self.captions)
        self.rules = RuleNegatives(vocabulary)
        self.one_process = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
        self.optimizer = build_optimizer(encoder, 1e-5, 0.1, (0.9, 0.98), 1e-6)
        self.n_edits, self.layer, self.batch, self.fit_images = n_edits, layer, batch, fit_images
        self.seeds = list(range(batch))
        encoder.train()

    def update(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def local_step(setting: LocalSetting, kind: str, edit_share: float, seen: dict[str, list[float]]) -> torch.Tensor:
    """The loss of one step of `kind` ("plain" or a key of `LOCAL_ARMS`) as `lace train` runs it."""
    encoder, pixels, tokens, n_edits, batch = (setting.encoder, setting.pixels, setting.tokens, setting.n_edits,
                                               setting.batch)
    if kind == "plain":
        U, V, scale = encoder(pixels, tokens)
        return clip_loss(U, V, scale)
    if kind == "floor":  # the upper layers on the maps and M unedited copies, no editing
        split = ImageTowerSplit(encoder.model, setting.layer)

        def unedited_copies(pixels: torch.Tensor) -> torch.Tensor:
            embeddings = split.upper(split.lower(pixels).repeat(1 + n_edits, 1, 1), reference_rows=batch)
            unedited_copies.negatives = embeddings[batch:].reshape(n_edits, batch, -1).transpose(0, 1)
            return embeddings[:batch]

        U, V, scale = encoder(pixels, tokens, encode_images=unedited_copies)
        return lace_loss(U, V, scale, image_negatives=unedited_copies.negatives,
                         image_valid=torch.ones(batch, n_edits, dtype=torch.bool))
    if kind == "shipped floor":
        return shipped_floor(setting)
    # U and the local negatives from one pass of the image tower
    share = edit_share if kind == "real_negative, share" else 1.0
    symmetric = "round_trip" if kind == "shipped" else "none"  # the arm that ships: round-trip counterparts
    image_pass = LocalImagePass(setting.editor, encoder.model, n_edits, setting.seeds, share, symmetric)
    U, V, scale = encoder(pixels, tokens, encode_images=image_pass)
    if kind == "local":
        seen["valid"].append(float(image_pass.valid.float().mean()))
        return lace_loss(U, V, scale, image_negatives=image_pass.negatives, image_valid=image_pass.valid)
    edits = EditedImages(image_pass.negatives, image_pass.valid,
                         describe_slots(setting.rules, setting.captions, image_pass.changes), image_pass.counterparts)
    rows = pair_rows([edits], encoder.encode_texts)  # the described captions in a second text pass
    if kind == "real_negative":  # what the described captions are, every row edited
        seen["pair_share"].append(float(rows.valid.any(dim=1).float().mean()))
        written = [text for row, keep in zip(edits.captions, rows.valid.tolist()) for text, on in zip(row, keep) if on]
        seen["distinct"].append(len(set(written)) / max(1, len(written)))  # 1: no described caption repeats
        seen["real_caption"].append(len(set(written) & set(setting.captions)) / max(1, len(written)))
    column = kind != "pairs"
    loss = lace_loss(U, V, scale, image_negatives=image_pass.negatives if column else None,
                     image_valid=image_pass.valid if column else None)
    # the chosen pairs arm (docs/results.md): with the column, the real image (or its counterpart) a negative of T'
    return loss + pair_term(rows, U, V, scale, None, setting.one_process, real_image_negative=column)


def shipped_floor(setting: LocalSetting) -> torch.Tensor:
    """The loss of the arm that ships with every tower pass it runs but no editing: the upper layers on the B maps
    and 2M unedited copies of each (edits and counterparts), the text tower on the B captions and M copies of each
    (the described captions), the same losses."""
    encoder, batch, n_edits = setting.encoder, setting.batch, setting.n_edits
    split = ImageTowerSplit(encoder.model, setting.layer)
    embeddings = split.upper(split.lower(setting.pixels).repeat(1 + 2 * n_edits, 1, 1), reference_rows=batch)
    copies = embeddings[batch:].reshape(2 * n_edits, batch, -1).transpose(0, 1)  # (B, 2M, d)
    texts = encoder.encode_tokens(setting.tokens.repeat(1 + n_edits, 1))
    U, V, scale = embeddings[:batch], texts[:batch], encoder.model.logit_scale.exp()
    valid = torch.ones(batch, n_edits, dtype=torch.bool)
    described = texts[batch:].reshape(n_edits, batch, -1).transpose(0, 1)  # (B, M, d)
    rows = PairRows(copies[:, :n_edits], described, valid, copies[:, n_edits:], valid)
    loss = lace_loss(U, V, scale, image_negatives=copies[:, :n_edits], image_valid=valid)
    return loss + pair_term(rows, U, V, scale, None, setting.one_process, real_image_negative=True)


def time_local(setting: LocalSetting, repeats: int, edit_share: float) -> dict:
    """Plain step against each LACE-local step of `LOCAL_ARMS`, interleaved; median over repeats."""
    kinds = ("plain", *LOCAL_ARMS)
    seen = {"valid": [], "pair_share": [], "distinct": [], "real_caption": []}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for rep in range(repeats + 1):  # the first round warms up
        for kind in kinds:
            start = time.perf_counter()
            setting.update(local_step(setting, kind, edit_share, seen))
            if rep:
                times[kind].append(time.perf_counter() - start)
    median = {kind: statistics.median(times[kind]) for kind in kinds}
    ratios = {LOCAL_ARMS[kind]: median[kind] / median["plain"] for kind in LOCAL_ARMS}
    return {"setting": "world micro-rn, LACE-local", "model": "lace-micro-rn-32", "batch": setting.batch,
            "n_edits": setting.n_edits, "layer": setting.layer, "edit_share": edit_share,
            "plain_ms": 1e3 * median["plain"], **{f"{kind}_ms": 1e3 * median[kind] for kind in LOCAL_ARMS},
            "over_plain": ratios, "valid_edit_share": statistics.mean(seen["valid"]),
            "pair_row_share": statistics.mean(seen["pair_share"]), "editor_fit_seconds": setting.fit_seconds,
            # described captions: the share of distinct ones, and of those that are also a real caption of the batch
            "described_distinct_share": statistics.mean(seen["distinct"]),
            "described_also_real_share": statistics.mean(seen["real_caption"]),
            "fit_images": setting.fit_images}


def shipped_parts(setting: LocalSetting, repeats: int) -> dict[str, float]:
    """Median ms of the arm that ships (round-trip symmetric pairs, every row edited), part by part (forward parts
    timed one by one, the backward whole), of the plain step, and of pieces alone (forward and backward): where the
    step's time goes."""
    encoder, pixels, tokens, n_edits, batch = (setting.encoder, setting.pixels, setting.tokens, setting.n_edits,
                                               setting.batch)
    editor, split = setting.editor, ImageTowerSplit(encoder.model, setting.layer)
    times: dict[str, list[float]] = {}

    def timed(name: str, work):
        start = time.perf_counter()
        out = work()
        times.setdefault(name, []).append(1e3 * (time.perf_counter() - start))
        return out

    def shipped() -> None:
        features = timed("image: lower layers (B)", lambda: split.lower(pixels))  # (B, P, C): a ResNet's, no prefix
        objects = timed("editor: reader", lambda: editor.locate(encoder.model, pixels, features, split.grid))
        slots = timed("editor: planner + recolour (+ effect check)", lambda: editor.steps(
            features, split.grid, n_edits, objects, RowGenerators(setting.seeds)))
        partners = timed("editor: round trips", lambda: counterpart_steps(
            "round_trip", editor.transport, features, split.grid, objects, slots))
        moved = features.unsqueeze(1) + torch.cat([slots.steps, partners], dim=1)  # (B, 2M, P, C)
        maps = torch.cat([features, moved.transpose(0, 1).flatten(0, 1)])
        embeddings = timed(f"image: upper layers ({1 + 2 * n_edits}B maps)",
                           lambda: split.upper(maps, reference_rows=batch))
        per_slot = embeddings[batch:].reshape(2 * n_edits, batch, -1).transpose(0, 1)  # (B, 2M, d)
        negatives, counterparts, valid = per_slot[:, :n_edits], per_slot[:, n_edits:], slots.valid
        U = real_stand_ins(embeddings[:batch], counterparts, valid)
        V = timed("text: real captions (B)", lambda: encoder.encode_tokens(tokens))
        changes = slot_changes(slots.kinds, slots.changes, editor.concept_names)
        described = timed("described captions written", lambda: describe_slots(setting.rules, setting.captions, changes))
        pairs = timed("text: described captions", lambda: pair_rows(
            [EditedImages(negatives, valid, described, counterparts)], encoder.encode_texts))
        scale = encoder.model.logit_scale.exp()
        loss = timed("losses", lambda: lace_loss(U, V, scale, image_negatives=negatives, image_valid=valid) + pair_term(
            pairs, U, V, scale, None, setting.one_process, real_image_negative=True))
        timed("backward (all)", loss.backward)
        timed("optimiser", setting.optimizer.step)
        setting.optimizer.zero_grad(set_to_none=True)

    def alone(name: str, work) -> None:
        timed(name, lambda: work().sum().backward())
        setting.optimizer.zero_grad(set_to_none=True)

    with torch.no_grad():
        unedited = split.lower(pixels)
    for rep in range(repeats + 1):
        if rep == 1:
            times.clear()  # the first round warms up
        timed("plain step", lambda: setting.update(local_step(setting, "plain", 1.0, {})))
        timed("arm that ships, step", shipped)
        alone("alone: text, B captions, fwd + bwd", lambda: encoder.encode_tokens(tokens))
        alone(f"alone: text, {n_edits}B captions, fwd + bwd", lambda: encoder.encode_tokens(tokens.repeat(n_edits, 1)))
        alone("alone: image lower layers, B, fwd + bwd", lambda: split.lower(pixels))
        alone("alone: image upper layers, B maps, fwd + bwd",
              lambda: split.upper(unedited.clone().requires_grad_(), reference_rows=batch))
        alone(f"alone: image upper layers, {1 + 2 * n_edits}B maps, fwd + bwd",
              lambda: split.upper(unedited.repeat(1 + 2 * n_edits, 1, 1).requires_grad_(), reference_rows=batch))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-edits", type=int, default=4)
    parser.add_argument("--vit-batch", type=int, default=8)
    parser.add_argument("--local-n-edits", type=int, default=2)
    parser.add_argument("--local-layer", default="layer1")
    parser.add_argument("--local-pretrained", default=None, help="checkpoint of lace-micro-rn-32 (e.g. the demo's base)")
    parser.add_argument("--local-edit-share", type=float, default=CANDIDATE_EDIT_SHARE,
                        help="share of the rows edited by the cheaper candidate of LACE-local pairs + real-image "
                             "negative (LocalEditConfig.edit_share; the arm runs with 1)")
    parser.add_argument("--local-only", action="store_true", help="time only the LACE-local setting")
    parser.add_argument("--parts", action="store_true", help="also time the arm that ships part by part")
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
    setting = LocalSetting(args.local_n_edits, args.local_layer, pretrained=args.local_pretrained)
    local = time_local(setting, args.repeats, args.local_edit_share)
    print(f"\n{local['setting']}, batch {local['batch']}, M = {local['n_edits']} at {local['layer']} (valid edits "
          f"{local['valid_edit_share']:.2f}, rows with a written caption {local['pair_row_share']:.2f}, described captions "
          f"distinct {local['described_distinct_share']:.2f}, also a real caption {local['described_also_real_share']:.2f}; "
          f"editor fit "
          f"{local['editor_fit_seconds']:.1f}s); the candidate edits a share {local['edit_share']} of the rows")
    print(f"{'arm':<58} {'ms':>8} {'x plain':>8}")
    print(f"{'plain':<58} {local['plain_ms']:>8.1f} {1.0:>8.3f}")
    for kind, arm in LOCAL_ARMS.items():
        print(f"{arm:<58} {local[f'{kind}_ms']:>8.1f} {local['over_plain'][arm]:>8.3f}")
    parts = shipped_parts(setting, args.repeats) if args.parts else None
    if parts:
        print(f"\nthe arm that ships ({CHOSEN_BEST}), part by part (ms, x the plain step)")
        for name, ms in parts.items():
            print(f"{name:<58} {ms:>8.1f} {ms / parts['plain step']:>8.3f}")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    if torch.cuda.is_available():
        peak_gb = torch.cuda.max_memory_allocated() / 2**30
    shipped = local["over_plain"][CHOSEN_BEST]
    print(json.dumps({
        "benchmark": "train_step", "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": args.threads, "settings": rows, "local": local, "parts_ms": parts,
        # every arm timed, over the plain step of its setting
        "lace_over_plain": {**{f"LACE ({r['setting']})": r["lace_over_plain"] for r in rows}, **local["over_plain"]},
        "shipped_arm": CHOSEN_BEST, "candidate_edit_share": args.local_edit_share,
        "shipped_over_plain": shipped, "vs_peer_ratio": shipped,
        "vs_floor_ratio": local["shipped_ms"] / local["shipped floor_ms"],  # the arm that ships over its no-editing floor
        "peak_gb": round(peak_gb, 3),
    }))


if __name__ == "__main__":
    main()

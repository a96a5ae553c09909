"""`ConceptDictionary`: one sparse dictionary shared by image and text embeddings.

Each modality m has a mean `mu_m`; an embedding z is worked on as its centred
direction `c_hat = (z - mu_m) / |z - mu_m|`, with `|z - mu_m|` kept, and coded as
`c_hat ~ a D` with `a >= 0` and at most `sparsity` non-zeros. The residual
`r = c_hat - a D` is kept, so an unedited code rebuilds the input exactly.

Two modes:
- "learned": online dictionary learning (`lace.dictionary.learning`) on the centred
  directions of both modalities together, streamed in mini-batches;
- "vocabulary": the atoms are given concept directions (centred, normalised text
  embeddings of the vocabulary), labelled by construction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor

from lace.dictionary import learning
from lace.dictionary.sparse_coding import SparseCodes, decode, encode
from lace.dictionary.streaming import Rows, RowSource, check_finite, streaming_mean
from lace.errors import LaceInputError, input_error
from lace.io import atomic_path, atomic_write_json, read_json, read_safetensors
from lace.manifest import add_to_manifest, verify
from lace.progress import bar as progress_bar

MODALITIES = ("image", "text")
MODES = ("learned", "vocabulary")
FORMAT_VERSION = 1
DICTIONARY_FILES = ("cfg.json", "dictionary.safetensors", "quality.json")
PARAMS = ("n_atoms", "sparsity", "mode", "method", "nonnegative", "batch_size", "n_epochs", "max_seconds",
          "forget_rate", "resample_every", "chunk_size", "random_state")
"""The parameters a saved dictionary records and `load` passes back to the constructor."""


@dataclass
class EncodedEmbeddings:
    """What the rebuild needs: codes (N, s) sparse, residual (N, d), centred norm (N,)."""

    codes: SparseCodes
    residual: Tensor
    norm: Tensor


class ConceptDictionary:
    """Sparse concept dictionary over centred image and text embeddings.

    Parameters
    ----------
    n_atoms: K, the number of atoms (ignored in vocabulary mode: one atom per concept).
    sparsity: s, the most non-zeros per code.
    mode: "learned" or "vocabulary".
    directions: `ConceptDirections` whose directions become the atoms (vocabulary mode).
    method: coder, "omp" or "topk" (see `lace.dictionary.sparse_coding`).
    nonnegative: codes a >= 0 (the method's setting); False gives plain OMP.
    batch_size: rows per learning mini-batch, split between the modalities in
        proportion to their pool sizes.
    n_epochs: passes over the pool (learned mode).
    max_seconds: stop learning after this many seconds (None: no limit).
    forget_rate: rho in beta_t = (1 - 1/t)^rho for the running statistics.
    resample_every: batches between dead-atom checks (0: never resample).
    chunk_size: rows per block when streaming means, codes and quality.
    random_state: seed for initial atoms and batch order.
    device: where the work runs ("cpu", "cuda").
    progress: show a progress bar while fitting.

    Learned state: `atoms_` (K, d), `mean_image_` (d,), `mean_text_` (d,),
    `mean_norm_image_`, `mean_norm_text_` (mean centred norms, floats),
    `atom_names_` (vocabulary mode, else None), `fit_seconds_`, `batches_seen_`; after a learned fit also
    `rows_seen_` and `resampled_atoms_` (dead atoms resampled while learning).
    """

    def __init__(
        self,
        n_atoms: int = 512,
        sparsity: int = 8,
        mode: str = "learned",
        directions=None,
        method: str = "omp",
        nonnegative: bool = True,
        batch_size: int = 4096,
        n_epochs: int = 1,
        max_seconds: float | None = None,
        forget_rate: float = 10.0,
        resample_every: int = 20,
        chunk_size: int = 65536,
        random_state: int = 0,
        device: str = "cpu",
        progress: bool = False,
    ):
        self.n_atoms = n_atoms
        self.sparsity = sparsity
        self.mode = mode
        self.directions = directions
        self.method = method
        self.nonnegative = nonnegative
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.max_seconds = max_seconds
        self.forget_rate = forget_rate
        self.resample_every = resample_every
        self.chunk_size = chunk_size
        self.random_state = random_state
        self.device = device
        self.progress = progress

    # ------------------------------------------------------------------ fitting
    def fit(self, image_embeddings: RowSource, text_embeddings: RowSource) -> ConceptDictionary:
        """Fit on image (N_img, d) and text (N_txt, d) unit embeddings: arrays, tensors or .npy paths.

        Paths are memory-mapped and read in chunks, so the pool never has to fit in memory.
        """
        self._check_params()
        images = Rows(image_embeddings, "image_embeddings")
        texts = Rows(text_embeddings, "text_embeddings")
        if images.dim != texts.dim:
            raise input_error(
                texts.name, "shape", f"the same dimension as the image embeddings ({images.dim})", texts.dim
            )
        started = time.perf_counter()
        self.mean_image_ = streaming_mean(images, self.chunk_size)
        self.mean_text_ = streaming_mean(texts, self.chunk_size)
        self.mean_norm_image_ = self._mean_centred_norm(images, self.mean_image_)
        self.mean_norm_text_ = self._mean_centred_norm(texts, self.mean_text_)
        self.atom_names_ = None
        self.batches_seen_ = 0
        if self.mode == "vocabulary":
            atoms = torch.as_tensor(self.directions.directions, dtype=torch.float32)
            if atoms.shape[1] != images.dim:
                raise input_error(
                    "directions", "directions", f"concept directions of dimension {images.dim}", atoms.shape[1]
                )
            self.atoms_ = (atoms / atoms.norm(dim=1, keepdim=True).clamp_min(1e-12)).to(self.device)
            self.atom_names_ = list(self.directions.names)
        else:
            self.atoms_ = self._fit_learned(images, texts)
        self.atoms_ = self.atoms_.cpu()
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def _check_params(self) -> None:
        if self.mode not in MODES:
            raise input_error("ConceptDictionary", "mode", f"one of {MODES}", self.mode)
        if self.mode == "vocabulary" and self.directions is None:
            raise input_error("ConceptDictionary", "directions", "concept directions in vocabulary mode", None)
        if self.mode == "learned" and self.n_atoms < 1:
            raise input_error("ConceptDictionary", "n_atoms", "a positive number of atoms", self.n_atoms)
        if self.sparsity < 1:
            raise input_error("ConceptDictionary", "sparsity", "a positive number of non-zeros", self.sparsity)
        if self.batch_size < 1 or self.chunk_size < 1:
            raise input_error("ConceptDictionary", "batch_size", "positive batch and chunk sizes", self.batch_size)

    def _mean_centred_norm(self, rows: Rows, mean: Tensor) -> float:
        total = 0.0
        for block in rows.chunks(self.chunk_size):
            total += float((block - mean).norm(dim=1).double().sum())
        return total / rows.n_rows

    def _fit_learned(self, images: Rows, texts: Rows) -> Tensor:
        generator = np.random.default_rng(self.random_state)
        n_total = images.n_rows + texts.n_rows
        n_batches = max(1, math.ceil(n_total / self.batch_size))
        image_block = math.ceil(images.n_rows / n_batches)
        text_block = math.ceil(texts.n_rows / n_batches)

        # initial atoms: random rows of the pool, both modalities
        n_init = min(self.n_atoms, n_total)
        picked = np.sort(generator.choice(n_total, size=n_init, replace=False))
        from_images = picked[picked < images.n_rows]
        from_texts = picked[picked >= images.n_rows] - images.n_rows
        initial = torch.cat(
            [
                self._centred_directions(images.take(from_images, self.device), "image"),
                self._centred_directions(texts.take(from_texts, self.device), "text"),
            ]
        )
        if n_init < self.n_atoms:  # a tiny pool: fill with random directions
            torch_generator = torch.Generator().manual_seed(self.random_state)
            extra = torch.randn(self.n_atoms - n_init, images.dim, generator=torch_generator)
            initial = torch.cat([initial, extra.to(self.device)])
        state = learning.init_state(initial)

        def batches() -> Iterator[Tensor]:
            for _ in range(self.n_epochs):
                for b in generator.permutation(n_batches):
                    parts = []
                    image_rows = images.read(b * image_block, min((b + 1) * image_block, images.n_rows), self.device)
                    text_rows = texts.read(b * text_block, min((b + 1) * text_block, texts.n_rows), self.device)
                    if image_rows.shape[0]:
                        parts.append(self._centred_directions(image_rows, "image"))
                    if text_rows.shape[0]:
                        parts.append(self._centred_directions(text_rows, "text"))
                    if parts:
                        yield torch.cat(parts)

        bar = progress_bar(total=n_batches * self.n_epochs, enabled=self.progress, desc="dictionary")
        learning.learn(
            state,
            batches(),
            self.sparsity,
            forget_rate=self.forget_rate,
            resample_every=self.resample_every,
            nonnegative=self.nonnegative,
            max_seconds=self.max_seconds,
            on_batch=lambda _: bar.update(1),
            method=self.method,
        )
        bar.close()
        self.batches_seen_ = state.batches_seen
        self.rows_seen_ = state.rows_seen
        self.resampled_atoms_ = state.resampled
        return state.atoms

    # ---------------------------------------------------------------- transform
    def _check_fitted(self) -> None:
        if not hasattr(self, "atoms_"):
            raise RuntimeError("ConceptDictionary is not fitted: call fit() or load() first")

    def _mean(self, modality: str, device: torch.device | str | None = None) -> Tensor:
        if modality not in MODALITIES:
            raise input_error("modality", None, f"one of {MODALITIES}", modality)
        name = "mean_image_" if modality == "image" else "mean_text_"
        return getattr(self, name) if device is None else self._on_device(name, device)

    def _on_device(self, name: str, device: torch.device | str) -> Tensor:
        """Fitted tensor `name` (`atoms_`, `mean_image_`, `mean_text_`) on `device`, copied once per device while it
        stays as it is: an editor on a GPU codes every step, and a copy from the host each time would stall the
        GPU's queue."""
        fitted, device = getattr(self, name), torch.device(device)
        if fitted.device == device:
            return fitted
        copies = self.__dict__.setdefault("_device_copies", {})
        source, version, copy = copies.get((name, str(device)), (None, None, None))
        if source is not fitted or version != fitted._version:  # replaced, or changed in place since
            copy = fitted.to(device)
            copies[name, str(device)] = (fitted, fitted._version, copy)
        return copy

    def _check_embeddings(self, z: Tensor, name: str = "embeddings") -> None:
        self._check_fitted()
        if z.ndim != 2 or z.shape[1] != self.atoms_.shape[1]:
            raise input_error(name, "shape", f"(N, {self.atoms_.shape[1]}) embeddings", tuple(z.shape))
        check_finite(z.detach(), name)

    def _centred_directions(self, z: Tensor, modality: str) -> Tensor:
        centred = z - self._mean(modality, z.device).to(z.dtype)
        return centred / centred.norm(dim=1, keepdim=True).clamp_min(1e-12)

    def centre(self, z: Tensor, modality: str) -> tuple[Tensor, Tensor]:
        """Centred directions c_hat (N, d) and centred norms |c| (N,) of unit embeddings z (N, d).

        Differentiable in z.
        """
        self._check_embeddings(z)
        centred = z - self._mean(modality, z.device).to(z.dtype)
        norm = centred.norm(dim=1)
        return centred / norm.clamp_min(1e-12).unsqueeze(1), norm

    def transform(self, z: Tensor | np.ndarray, modality: str, dense: bool = False) -> Tensor | SparseCodes:
        """Codes of unit embeddings z (N, d): `SparseCodes` (N, s), or (N, K) when `dense`."""
        z = torch.as_tensor(z, dtype=torch.float32)
        directions, _ = self.centre(z.detach(), modality)
        return self.code_directions(directions, dense)

    def code_directions(self, directions: Tensor, dense: bool = False) -> Tensor | SparseCodes:
        """Codes of already centred, normalised directions c_hat (N, d), no checks."""
        atoms = self._on_device("atoms_", directions.device)
        return encode(
            directions, atoms, self.sparsity, self.method, self.nonnegative, dense, chunk_size=self.chunk_size
        )

    def encode_embeddings(self, z: Tensor, modality: str) -> EncodedEmbeddings:
        """Codes, residual r = c_hat - a D (N, d) and centred norm |c| (N,): all the rebuild needs."""
        with torch.no_grad():
            directions, norm = self.centre(torch.as_tensor(z, dtype=torch.float32), modality)
            codes = self.code_directions(directions)
            residual = directions - decode(codes, self._on_device("atoms_", directions.device))
        return EncodedEmbeddings(codes, residual, norm)

    def inverse_transform(
        self,
        codes: Tensor | SparseCodes,
        modality: str,
        residual: Tensor | None = None,
        norm: Tensor | None = None,
    ) -> Tensor:
        """Unit embeddings (N, d) from codes: normalize(mu_m + |c| (a D + r) / |a D + r|).

        With the residual and norm from `encode_embeddings` the input comes back exactly;
        without them r = 0 and |c| is the modality's mean centred norm. Codes with NaN or inf,
        or dense codes not of width K, are a `LaceInputError`.
        """
        self._check_fitted()
        values = codes if isinstance(codes, Tensor) else codes.values
        if isinstance(codes, Tensor) and (codes.ndim != 2 or codes.shape[1] != self.atoms_.shape[0]):
            raise input_error("codes", "shape", f"(N, {self.atoms_.shape[0]}) dense codes", tuple(codes.shape))
        check_finite(values.detach(), "codes")
        direction = decode(codes, self._on_device("atoms_", _device_of(codes)))
        if residual is not None:
            direction = direction + residual
        if norm is None:
            norm = torch.full(
                (direction.shape[0],),
                self.mean_norm_image_ if modality == "image" else self.mean_norm_text_,
                device=direction.device,
            )
        return self.decode_directions(direction, modality, norm)

    def decode_directions(self, directions: Tensor, modality: str, norm: Tensor) -> Tensor:
        """Unit embeddings (..., d) from centred directions (..., d), not necessarily unit, and
        centred norms broadcastable to (...): normalize(mu_m + |c| c / |c|). Differentiable."""
        direction = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        rebuilt = self._mean(modality, direction.device).to(direction.dtype) + norm.unsqueeze(-1) * direction
        return rebuilt / rebuilt.norm(dim=-1, keepdim=True)

    # ------------------------------------------------------------------ quality
    def quality(self, image_embeddings: RowSource, text_embeddings: RowSource) -> dict:
        """Per modality: FVU, mean cos(c_hat, a D), mean L0, dead-atom share; plus dead share overall.

        FVU = sum |c_hat - a D|^2 / sum |c_hat - mean c_hat|^2. An atom is dead in a
        modality when no embedding of it uses the atom. Stored as `quality_` and saved
        with the dictionary as quality.json.
        """
        self._check_fitted()
        report: dict = {}
        used_any = torch.zeros(self.atoms_.shape[0], dtype=torch.bool)
        for modality, source in (("image", image_embeddings), ("text", text_embeddings)):
            rows = Rows(source, f"{modality}_embeddings")
            if rows.dim != self.atoms_.shape[1]:
                raise input_error(rows.name, "shape", f"(N, {self.atoms_.shape[1]}) embeddings", (rows.n_rows, rows.dim))
            error_sum = cosine_sum = l0_sum = 0.0
            direction_sum = torch.zeros(rows.dim, dtype=torch.float64)
            square_sum = 0.0
            used = torch.zeros(self.atoms_.shape[0], dtype=torch.bool)
            for block in rows.chunks(self.chunk_size, self.device):
                directions = self._centred_directions(block, modality)
                codes = self.code_directions(directions)
                reconstruction = decode(codes, self.atoms_.to(directions.device))
                error_sum += float(((directions - reconstruction) ** 2).sum())
                cosine = (directions * reconstruction).sum(1) / reconstruction.norm(dim=1).clamp_min(1e-12)
                cosine_sum += float(cosine.sum())
                active = codes.values > 0 if self.nonnegative else codes.values != 0
                l0_sum += float(active.sum())
                used[codes.indices[active].cpu()] = True
                direction_sum += directions.double().sum(0).cpu()
                square_sum += float((directions.double() ** 2).sum())
            n = rows.n_rows
            total_variance = square_sum - float((direction_sum**2).sum()) / n
            report[modality] = {
                "fvu": error_sum / max(total_variance, 1e-12),
                "mean_cosine": cosine_sum / n,
                "mean_l0": l0_sum / n,
                "dead_atom_share": 1.0 - float(used.float().mean()),
                "n": n,
            }
            used_any |= used
        report["dead_atom_share"] = 1.0 - float(used_any.float().mean())
        report["n_atoms"] = int(self.atoms_.shape[0])
        report["sparsity"] = self.sparsity
        self.quality_ = report
        return report

    # -------------------------------------------------------------- persistence
    def get_params(self) -> dict:
        """The constructor's parameters as saved in cfg.json (`PARAMS`: all but the directions, device, progress)."""
        return {name: getattr(self, name) for name in PARAMS}

    def save(self, directory: str | Path) -> Path:
        """Write cfg.json, dictionary.safetensors (and quality.json once measured) into `directory`."""
        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {
            "atoms": self.atoms_.contiguous().cpu(),
            "mean_image": self.mean_image_.contiguous().cpu(),
            "mean_text": self.mean_text_.contiguous().cpu(),
        }
        with atomic_path(directory / "dictionary.safetensors") as tmp:
            save_file(tensors, str(tmp))
        config = {
            "format_version": FORMAT_VERSION,
            "params": self.get_params(),
            "n_atoms": int(self.atoms_.shape[0]),
            "dim": int(self.atoms_.shape[1]),
            "mean_norm_image": self.mean_norm_image_,
            "mean_norm_text": self.mean_norm_text_,
            "atom_names": self.atom_names_,
            "fit_seconds": getattr(self, "fit_seconds_", None),
            "batches_seen": getattr(self, "batches_seen_", 0),
        }
        atomic_write_json(directory / "cfg.json", config)
        if hasattr(self, "quality_"):
            atomic_write_json(directory / "quality.json", self.quality_)
        add_to_manifest(directory, [name for name in DICTIONARY_FILES if (directory / name).is_file()])
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> ConceptDictionary:
        """Read a dictionary written by `save`."""
        directory = Path(directory)
        verify(directory, DICTIONARY_FILES)
        config = read_json(directory / "cfg.json")
        if not isinstance(config, dict) or config.get("format_version") != FORMAT_VERSION:
            raise input_error(directory / "cfg.json", "format_version", str(FORMAT_VERSION), config.get("format_version") if isinstance(config, dict) else None)
        tensors = read_safetensors(directory / "dictionary.safetensors")
        try:
            dictionary = cls(**config["params"], device=device)
            dictionary.mean_norm_image_ = float(config["mean_norm_image"])
            dictionary.mean_norm_text_ = float(config["mean_norm_text"])
        except (KeyError, TypeError, ValueError) as error:
            raise LaceInputError(f"{directory / 'cfg.json'}: not a dictionary config ({error!r})") from error
        try:
            dictionary.atoms_ = tensors["atoms"]
            dictionary.mean_image_ = tensors["mean_image"]
            dictionary.mean_text_ = tensors["mean_text"]
        except KeyError as error:
            raise LaceInputError(f"{directory / 'dictionary.safetensors'}: tensor {error} missing") from error
        dim = dictionary.atoms_.shape[-1]
        if dictionary.atoms_.ndim != 2 or dictionary.mean_image_.shape != (dim,) or dictionary.mean_text_.shape != (dim,):
            raise LaceInputError(f"{directory / 'dictionary.safetensors'}: expected atoms (K, d) and means (d,), got "
                                 f"{tuple(dictionary.atoms_.shape)}, {tuple(dictionary.mean_image_.shape)}")
        dictionary.atom_names_ = config.get("atom_names")
        dictionary.fit_seconds_ = config.get("fit_seconds")
        dictionary.batches_seen_ = config.get("batches_seen", 0)
        quality_path = directory / "quality.json"
        if quality_path.is_file():
            dictionary.quality_ = read_json(quality_path, dict)
        return dictionary


def _device_of(codes: Tensor | SparseCodes) -> torch.device:
    return codes.device if isinstance(codes, Tensor) else codes.values.device

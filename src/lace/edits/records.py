"""What an edit batch returns: counterfactual embeddings, validity and per-edit records as tensors."""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor

from lace.edits.config import EDIT_KINDS

NO_EDIT = -1
WEIGHT_FIELDS = ("source_weight_before", "source_weight_after", "target_weight_before", "target_weight_after",
                 "step_size")
"""The (B, M) float fields of `EditRecords`, copied as they are into each record's dict."""


@dataclass
class EditRecords:
    """One entry per (embedding b, edit slot m); every field is a (B, M) tensor.

    kind: index into EDIT_KINDS, -1 where nothing could be proposed.
    source, target: concept (or, atom-level, atom) edited; target -1 for attenuate; for
        rebind the two attributes (source read as bound to objects[..., 0] before).
    source_weight_before/after, target_weight_before/after: concept weights (sum of
        owned atoms' codes) before and after the edit (a rebind leaves them as they were).
    step_size: |(a' - a) D|, the length of the step added to c_hat.
    proposed: a feasible edit was found for the slot.
    passed_check: the rebuilt embedding passed the effect check.
    objects: (B, M, 2) long, for rebind the objects the source and target attributes
        were bound to (-1 for other kinds); None when the editor cannot rebind.
    """

    kind: Tensor
    source: Tensor
    target: Tensor
    source_weight_before: Tensor
    source_weight_after: Tensor
    target_weight_before: Tensor
    target_weight_after: Tensor
    step_size: Tensor
    proposed: Tensor
    passed_check: Tensor
    objects: Tensor | None = None

    def to_dicts(self, unit_names: list[str], unit_atoms: list[list[int]] | None = None) -> list[dict]:
        """Flatten to one dict per (b, m) for reports; `unit_names[i]` names source/target i."""
        rows = []
        columns = {f.name: getattr(self, f.name).detach().cpu().tolist() for f in fields(self)
                   if getattr(self, f.name) is not None}
        batch, slots = self.kind.shape
        for b in range(batch):
            for m in range(slots):
                kind = columns["kind"][b][m]
                source, target = columns["source"][b][m], columns["target"][b][m]
                record = {
                    "embedding": b,
                    "slot": m,
                    "kind": EDIT_KINDS[kind] if kind >= 0 else None,
                    "source": unit_names[source] if kind >= 0 else None,
                    "target": unit_names[target] if kind >= 0 and target >= 0 else None,
                    **{name: columns[name][b][m] for name in WEIGHT_FIELDS},
                    "proposed": bool(columns["proposed"][b][m]),
                    "passed_check": bool(columns["passed_check"][b][m]),
                }
                if "objects" in columns and kind == EDIT_KINDS.index("rebind"):
                    record["objects"] = [unit_names[o] for o in columns["objects"][b][m]]
                if unit_atoms is not None and kind >= 0:
                    atoms = list(unit_atoms[source])
                    if target >= 0:
                        atoms += unit_atoms[target]
                    record["atoms"] = atoms
                rows.append(record)
        return rows


@dataclass
class Counterfactuals:
    """embeddings: (B, M, d) unit vectors (differentiable in the input z); valid: (B, M) bool,
    True where the edit was proposed and passed the effect check; records: `EditRecords`."""

    embeddings: Tensor
    valid: Tensor
    records: EditRecords

    @property
    def n_valid(self) -> int:
        return int(self.valid.sum())

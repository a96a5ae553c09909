"""The planner: which unit, kind and target each of (B, M) edit slots gets, and the step.

Built once per editor from the labelling, the concept directions and the `EditConfig`;
it holds the unit tables (ownership, typical patterns, compatible pairs) per device and
turns (B, K) codes into an `EditPlan`. Random draws are made in a fixed order (three (B, M, U)
keys, (B, M, 3) kind keys, then, when rebind is on, its (B, M) draws and (B, M, 1) kind keys),
so generators seeded alike give the same plan (and per-row generators, `RowGenerators`, the same
plan for a row whatever batch it is in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lace.concepts.bindings import BindingDirections
from lace.concepts.directions import ConceptDirections
from lace.concepts.labelling import AtomLabelling, concept_weights, editable_concepts
from lace.edits import kernels
from lace.edits.config import EditConfig
from lace.edits.kernels import ATTENUATE, CODE_KINDS, REBIND, SWAP, TRANSPLANT
from lace.edits.rebind import RebindPlan, plan_rebind
from lace.edits.records import EDIT_KINDS, NO_EDIT
from lace.row_random import Randomness, uniform


@dataclass
class EditPlan:
    """Edits chosen for (B, M) slots; all tensors without gradient."""

    centred: Tensor  # (B, d) c_hat before
    kind: Tensor  # (B, M) long
    source: Tensor  # (B, M) long unit
    target: Tensor  # (B, M) long unit, -1 if none
    proposed: Tensor  # (B, M) bool
    step: Tensor  # (B, M, d) (a' - a) D
    step_size: Tensor  # (B, M)
    weights_before: tuple[Tensor, Tensor]  # source, target (B, M)
    weights_after: tuple[Tensor, Tensor]
    rebind: RebindPlan | None = None


@dataclass
class _Slots:
    """The candidates of every slot before its kind is drawn."""

    source: Tensor  # (B, M)
    has_source: Tensor  # (B, M)
    swap_target: Tensor  # (B, M)
    swap_ok: Tensor  # (B, M)
    transplant_target: Tensor  # (B, M)
    transplant_ok: Tensor  # (B, M)


def unit_tables(atoms: Tensor, labelling: AtomLabelling, directions: ConceptDirections, tau_align: float,
                atom_level: bool, bindings: BindingDirections | None) -> dict[str, Tensor]:
    """The planner's tables on the CPU: ownership (K, U), transplant patterns (U, K), compatible
    unit pairs (U, U), unit directions (U, d) and, when rebinds are possible, the compound tables."""
    n_concepts = len(directions)
    atom_concept = labelling.atom_concept
    if atom_level:
        unit_atoms = labelling.aligned(tau_align).nonzero().squeeze(1)  # (U,)
        ownership = torch.zeros(atoms.shape[0], unit_atoms.shape[0])
        ownership[unit_atoms, torch.arange(unit_atoms.shape[0])] = 1.0
        unit_concept = atom_concept[unit_atoms]
        transplant_pattern = ownership.T.clone()
    else:
        ownership = labelling.ownership(n_concepts, tau_align)  # (K, C)
        unit_concept = torch.arange(n_concepts)
        pattern = labelling.patterns(n_concepts, tau_align)  # (K,)
        transplant_pattern = (ownership * pattern.unsqueeze(1)).T.contiguous()  # (C, K)
    unit_group = directions.group_ids()[unit_concept]
    has_atoms = ownership.sum(0) > 0
    compatible = (
        (unit_group.unsqueeze(1) == unit_group.unsqueeze(0))
        & (unit_concept.unsqueeze(1) != unit_concept.unsqueeze(0))
        & has_atoms.unsqueeze(0)
        & has_atoms.unsqueeze(1)
    )
    unit_directions = directions.directions.float()[unit_concept]
    tables = {
        "atoms": atoms,
        "ownership": ownership,
        "ownership_t": ownership.T.contiguous(),
        "transplant_pattern": transplant_pattern,
        "has_atoms": has_atoms,
        "compatible": compatible,
        "similarity": unit_directions @ unit_directions.T,
        "unit_directions": unit_directions,
    }
    if bindings is not None and not atom_level:
        compound_index, compound_table = bindings.compound_table(directions.names)
        if compound_table.shape[0]:
            tables.update({
                "compound_index": compound_index,
                "compound_table": compound_table,
                "is_attribute": torch.tensor([kind == "attribute" for kind in directions.kinds]),
                "is_object": torch.tensor([kind == "object" for kind in directions.kinds]),
                "group_ids": directions.group_ids(),
            })
    return tables


class EditPlanner:
    """Chooses the edits of (B, M) slots from codes (B, K); see the module docstring."""

    def __init__(self, atoms: Tensor, labelling: AtomLabelling, directions: ConceptDirections, config: EditConfig,
                 tau_align: float, bindings: BindingDirections | None = None):
        self.config = config
        self.directions = directions
        self._cpu = unit_tables(atoms, labelling, directions, tau_align, config.atom_level, bindings)
        self._by_device: dict[torch.device, dict[str, Tensor]] = {}

    @property
    def can_rebind(self) -> bool:
        """True when there are compound directions for the concepts (rebind can propose)."""
        return "compound_table" in self._cpu

    def tables(self, device: torch.device) -> dict[str, Tensor]:
        """The unit tables on `device` (copied once per device)."""
        if device not in self._by_device:
            self._by_device[device] = {name: t.to(device) for name, t in self._cpu.items()}
        return self._by_device[device]

    def plan(self, centred: Tensor, codes: Tensor, n_edits: int, generator: Randomness,
             named: tuple[int, int] | None = None, forced_kind: int | None = None) -> EditPlan:
        """An `EditPlan` for centred directions (B, d) with dense codes (B, K).

        named: (source, target) units fixed for every slot (target -1: none). forced_kind: the
        one kind allowed (a named `apply`), which also lets a merely present source take part.
        """
        tables = self.tables(centred.device)
        weights = concept_weights(codes, tables["ownership"])  # (B, U)
        editable = editable_concepts(weights, self.config.tau_use) & tables["has_atoms"]
        batch, n_units = weights.shape
        keys = uniform((3, batch, n_edits, n_units), generator, centred.device, batch_dim=1)
        kind_keys = uniform((batch, n_edits, CODE_KINDS), generator, centred.device)
        # `apply` asks only that the source be present, training asks that it be editable
        usable = (weights > 0) if forced_kind is not None else editable
        slots = self._slots(weights, editable, usable, keys, n_edits, named)
        feasible = torch.stack([slots.has_source, slots.has_source & slots.swap_ok,
                                slots.has_source & slots.transplant_ok], dim=-1)  # (B, M, 3)
        # rebind draws its randomness after the code edits', so without it they are unchanged
        rebind = None
        rebind_enabled = forced_kind == REBIND if forced_kind is not None else "rebind" in self.config.kinds
        if rebind_enabled and self.can_rebind:
            rebind = self._plan_rebind(centred, weights, editable, usable, named, n_edits, generator)
        if rebind is None:
            feasible = torch.cat([feasible, torch.zeros_like(feasible[..., :1])], dim=-1)
            kind_keys = torch.cat([kind_keys, torch.zeros_like(kind_keys[..., :1])], dim=-1)
        else:
            feasible = torch.cat([feasible, rebind.proposed.unsqueeze(-1)], dim=-1)
            kind_keys = torch.cat([kind_keys, uniform((batch, n_edits, 1), generator, centred.device)], dim=-1)
        if forced_kind is not None:
            kind_enabled = torch.arange(len(EDIT_KINDS), device=centred.device) == forced_kind
        else:
            kind_enabled = torch.tensor([k in self.config.kinds for k in EDIT_KINDS], device=centred.device)
        feasible = feasible & kind_enabled  # (B, M, 4)
        proposed = feasible.any(-1)
        kind = torch.where(proposed, _pick(feasible, kind_keys), NO_EDIT)
        return self._step(centred, codes, weights, slots, kind, proposed, rebind)

    def _slots(self, weights: Tensor, editable: Tensor, usable: Tensor, keys: Tensor, n_edits: int,
               named: tuple[int, int] | None) -> _Slots:
        """Source, swap target and transplant target of every slot, and whether each is feasible."""
        tables = self.tables(weights.device)
        batch, n_units = weights.shape
        shape = (batch, n_edits)
        if named is None:
            source = _pick(editable.unsqueeze(1).expand(batch, n_edits, n_units), keys[0])
            has_source = editable.any(1, keepdim=True).expand(shape)
        else:
            source = torch.full(shape, named[0], dtype=torch.long, device=weights.device)
            has_source = usable[:, named[0]].unsqueeze(1).expand(shape)
        compatible = tables["compatible"][source]  # (B, M, U)
        source_weight = weights.gather(1, source)  # (B, M)
        swap_candidates = compatible & usable.unsqueeze(1)
        inactive_candidates = compatible & (weights <= 0).unsqueeze(1)
        if named is not None:
            only_target = torch.arange(n_units, device=weights.device) == named[1]
            swap_candidates = swap_candidates & only_target
            inactive_candidates = inactive_candidates & only_target
        swap_target = _pick(swap_candidates, keys[1])
        if self.config.target == "hard":
            transplant_target = _pick(inactive_candidates, tables["similarity"][source])
        else:
            transplant_target = _pick(inactive_candidates, keys[2])
        swap_target_weight = weights.gather(1, swap_target)
        gap = (source_weight - swap_target_weight).abs()
        swap_ok = swap_candidates.any(-1) & (
            gap > self.config.swap_min_gap * torch.maximum(source_weight, swap_target_weight))
        return _Slots(source, has_source, swap_target, swap_ok, transplant_target, inactive_candidates.any(-1))

    def _step(self, centred: Tensor, codes: Tensor, weights: Tensor, slots: _Slots, kind: Tensor,
              proposed: Tensor, rebind: RebindPlan | None) -> EditPlan:
        """The edited codes and the step (a' - a) D of every slot, through the per-kind kernels."""
        tables = self.tables(centred.device)
        source = slots.source
        target = torch.where(kind == SWAP, slots.swap_target,
                             torch.where(kind == TRANSPLANT, slots.transplant_target, NO_EDIT))
        if rebind is not None:
            is_rebind = kind == REBIND
            source = torch.where(is_rebind, rebind.attributes[..., 0], source)
            target = torch.where(is_rebind, rebind.attributes[..., 1], target)
        source_weight = weights.gather(1, source)
        target_weight = torch.where(target >= 0, weights.gather(1, target.clamp_min(0)), torch.zeros_like(source_weight))
        by_kind = {ATTENUATE: kernels.attenuate(source_weight, self.config.gamma),
                   SWAP: kernels.swap(source_weight, target_weight),
                   TRANSPLANT: kernels.transplant(source_weight, self.config.strength)}
        coefficients = kernels.select_coefficients(kind, proposed & (kind != REBIND), by_kind)
        source_atoms = tables["ownership_t"][source]  # (B, M, K)
        target_atoms = tables["ownership_t"][target.clamp_min(0)] * (target >= 0).unsqueeze(-1)
        delta = kernels.code_delta(codes, coefficients, source_atoms, target_atoms,
                                   tables["transplant_pattern"][target.clamp_min(0)])
        edited = codes.unsqueeze(1) + delta  # (B, M, K)
        step = delta @ tables["atoms"]  # (B, M, d)
        if rebind is not None:  # a rebind leaves the code as it is and moves along compound directions
            step = torch.where((kind == REBIND).unsqueeze(-1), rebind.step, step)
        after = ((edited * source_atoms).sum(-1), (edited * target_atoms).sum(-1))
        return EditPlan(centred, kind, source, target, proposed, step, step.norm(dim=-1),
                        (source_weight, target_weight), after, rebind)

    def _plan_rebind(self, centred: Tensor, weights: Tensor, editable: Tensor, usable: Tensor,
                     named: tuple[int, int] | None, n_edits: int,
                     generator: Randomness) -> RebindPlan | None:
        """Rebind proposals for every slot, or None when the named pair is not two attributes."""
        tables = self.tables(centred.device)
        if named is not None and any(self.directions.kinds[i] != "attribute" for i in named):
            return None
        draws = None if named is not None else uniform((centred.shape[0], n_edits), generator, centred.device)
        # the attributes are `usable` (present suffices for a named `apply`); the objects, which
        # the planner picks itself, must be strongly used, so a stray small weight never takes part
        return plan_rebind(centred, weights, usable & tables["has_atoms"], editable, tables["is_attribute"],
                           tables["is_object"], tables["group_ids"], tables["compound_index"],
                           tables["compound_table"], n_edits, self.config.strength, draws, named)



def _pick(candidates: Tensor, scores: Tensor) -> Tensor:
    """Index of the best-scoring candidate along the last axis (0 where there is none)."""
    return torch.where(candidates, scores, torch.full_like(scores, -float("inf"))).argmax(-1)

"""Counterfactual embeddings by editing sparse concept codes, batched: B embeddings x M edits.

For each embedding z (unit, modality m): c_hat = (z - mu_m) / |z - mu_m|, code a
(frozen dictionary, no gradient). An edit turns a into a'; the rebuilt embedding is

    c_hat' = c_hat + (a' - a) D,     z' = normalize(mu_m + |c| c_hat' / |c_hat'|),

so the residual c_hat - a D is kept, and z' is a differentiable function of z with
the step (a' - a) D held constant.

Edits act on units: whole concepts (all atoms a concept owns) by default, single
aligned atoms with `atom_level=True` (where rebind, a whole-concept edit, proposes nothing).
- attenuate(c, gamma): the atoms of c scaled by gamma.
- swap(c, c'): both editable, same type; each takes the other's total weight in
  proportion to its own pattern. Skipped when |w_c - w_c'| <= swap_min_gap x max(w_c, w_c').
- transplant(c -> c'): c editable, c' same type with weight 0; p_c removed and
  strength x w_c added over c''s atoms in c''s typical pattern.
  Target "random" (uniform over candidates), "hard" (the candidate whose concept
  direction is closest to c's) or a named pair "source=target".
- rebind(a1, a2): two attributes of one group trade the objects they are bound to,
  along compound directions (`lace.edits.rebind`); needs `bindings`
  (`lace.concepts.bindings.BindingDirections`), without them it proposes nothing.
Slot kinds are drawn uniformly among the enabled kinds feasible for that slot.

Effect check on the rebuilt embedding's centred direction, with readouts
r_c = cos(c_hat, e_c): attenuate lowers r_c by at least `attenuate_margin`;
transplant raises r_c' and lowers r_c; swap makes r_c - r_c' change sign; rebind makes
the pairing readouts cross.

Controls use exactly the same planned edits and step sizes |(a' - a) D|: a random
isotropic direction (`random_control`) or the plain concept directions
(`concept_arithmetic`: e_c' - e_c for transplant and swap, -e_c for attenuate; a
rebind already moves along directions, so its concept-arithmetic control is itself).
Pass generators seeded alike to get the same edits as `counterfactuals`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lace.concepts.bindings import BindingDirections
from lace.concepts.directions import ConceptDirections
from lace.concepts.labelling import (
    DEFAULT_TAU_USE,
    AtomLabelling,
    concept_weights,
    editable_concepts,
)
from lace.dictionary.concept_dictionary import MODALITIES, ConceptDictionary
from lace.dictionary.sparse_coding import encode
from lace.edits.rebind import RebindPlan, binding_margin, plan_rebind
from lace.edits.records import EDIT_KINDS, NO_EDIT, Counterfactuals, EditRecords
from lace.edits.spec import EditSpec, parse_edit, parse_pair
from lace.errors import LaceInputError, input_error

ATTENUATE, SWAP, TRANSPLANT, REBIND = range(4)
CODE_KINDS = 3  # the kinds that edit the sparse code; rebind comes after them
TARGET_MODES = ("random", "hard")


@dataclass
class _Plan:
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


class CounterfactualEditor:
    """Makes counterfactual embeddings from a frozen `ConceptDictionary`.

    kinds: enabled edit kinds (subset of EDIT_KINDS). gamma: attenuate factor in [0, 1).
    strength: transplant weight multiplier (> 0). target: "random", "hard" or "source=target".
    tau_align: alignment threshold for owned atoms (None: the labelling's calibrated one).
    tau_use: strongly-used threshold relative to the largest concept weight.
    effect_check: keep only edits that pass the check. atom_level: edit single atoms.
    swap_min_gap: relative weight gap below which a swap is skipped.
    attenuate_margin: the readout drop (cosine) an attenuation must achieve.
    bindings: compound directions for rebind (None: rebind proposes nothing).
    """

    def __init__(
        self,
        dictionary: ConceptDictionary,
        labelling: AtomLabelling,
        directions: ConceptDirections,
        kinds=EDIT_KINDS,
        gamma: float = 0.0,
        strength: float = 1.0,
        target: str = "random",
        tau_align: float | None = None,
        tau_use: float = DEFAULT_TAU_USE,
        effect_check: bool = True,
        atom_level: bool = False,
        swap_min_gap: float = 0.1,
        attenuate_margin: float = 0.02,
        bindings: BindingDirections | None = None,
    ):
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        if not kinds or any(kind not in EDIT_KINDS for kind in kinds):
            raise input_error("CounterfactualEditor", "kinds", f"a non-empty subset of {EDIT_KINDS}", kinds)
        if not 0.0 <= gamma < 1.0:
            raise input_error("CounterfactualEditor", "gamma", "a value in [0, 1)", gamma)
        if strength <= 0:
            raise input_error("CounterfactualEditor", "strength", "a positive transplant strength", strength)
        if not 0.0 <= tau_use <= 1.0:
            raise input_error("CounterfactualEditor", "tau_use", "a value in [0, 1]", tau_use)
        if directions.directions.shape[1] != dictionary.atoms_.shape[1]:
            raise input_error("concept directions", "directions", f"dimension {dictionary.atoms_.shape[1]}", directions.directions.shape[1])
        if bindings is not None and len(bindings) and bindings.dim != dictionary.atoms_.shape[1]:
            raise input_error("binding directions", "directions", f"dimension {dictionary.atoms_.shape[1]}", bindings.dim)
        self.dictionary = dictionary
        self.labelling = labelling
        self.directions = directions
        self.kinds = kinds
        self.gamma = gamma
        self.strength = strength
        self.target = target
        self.tau_align = labelling.tau_align if tau_align is None else tau_align
        self.tau_use = tau_use
        self.effect_check = effect_check
        self.atom_level = atom_level
        self.swap_min_gap = swap_min_gap
        self.attenuate_margin = attenuate_margin
        self.bindings = bindings
        self.named_pair = None if target in TARGET_MODES else self._named_pair(target)
        self._buffers_by_device: dict[torch.device, dict[str, Tensor]] = {}
        self._cpu = self._build_buffers()
        if not bool(self._cpu["has_atoms"].any()):
            raise input_error(
                "CounterfactualEditor", "tau_align", "a threshold at which some atom is aligned with a concept",
                f"{self.tau_align:.3f}, best alignment {float(labelling.atom_alignment.max()):.3f}",
            )

    # --------------------------------------------------------------- set-up
    def _build_buffers(self) -> dict[str, Tensor]:
        n_concepts = len(self.directions)
        atoms = self.dictionary.atoms_.float()
        aligned = self.labelling.aligned(self.tau_align)
        atom_concept = self.labelling.atom_concept
        if self.atom_level:
            unit_atoms = aligned.nonzero().squeeze(1)  # (U,)
            ownership = torch.zeros(atoms.shape[0], unit_atoms.shape[0])
            ownership[unit_atoms, torch.arange(unit_atoms.shape[0])] = 1.0
            unit_concept = atom_concept[unit_atoms]
            transplant_pattern = ownership.T.clone()
        else:
            ownership = self.labelling.ownership(n_concepts, self.tau_align)  # (K, C)
            unit_concept = torch.arange(n_concepts)
            pattern = self.labelling.patterns(n_concepts, self.tau_align)  # (K,)
            transplant_pattern = (ownership * pattern.unsqueeze(1)).T.contiguous()  # (C, K)
        concept_directions = self.directions.directions.float()
        unit_group = self.directions.group_ids()[unit_concept]
        has_atoms = ownership.sum(0) > 0
        compatible = (
            (unit_group.unsqueeze(1) == unit_group.unsqueeze(0))
            & (unit_concept.unsqueeze(1) != unit_concept.unsqueeze(0))
            & has_atoms.unsqueeze(0)
            & has_atoms.unsqueeze(1)
        )
        unit_directions = concept_directions[unit_concept]
        rebind = {}
        if self.bindings is not None and not self.atom_level:
            compound_index, compound_table = self.bindings.compound_table(self.directions.names)
            if compound_table.shape[0]:
                kinds = self.directions.kinds
                rebind = {
                    "compound_index": compound_index,
                    "compound_table": compound_table,
                    "is_attribute": torch.tensor([kind == "attribute" for kind in kinds]),
                    "is_object": torch.tensor([kind == "object" for kind in kinds]),
                    "group_ids": self.directions.group_ids(),
                }
        return {
            **rebind,
            "atoms": atoms,
            "gram": atoms @ atoms.T,
            "mean_image": self.dictionary.mean_image_.float(),
            "mean_text": self.dictionary.mean_text_.float(),
            "ownership": ownership,
            "ownership_t": ownership.T.contiguous(),
            "transplant_pattern": transplant_pattern,
            "has_atoms": has_atoms,
            "compatible": compatible,
            "similarity": unit_directions @ unit_directions.T,
            "unit_directions": unit_directions,
        }

    def _buffers(self, device: torch.device) -> dict[str, Tensor]:
        if device not in self._buffers_by_device:
            self._buffers_by_device[device] = {name: t.to(device) for name, t in self._cpu.items()}
        return self._buffers_by_device[device]

    def _named_pair(self, text: str) -> tuple[int, int]:
        source, target = parse_pair(text, "target")
        return self._resolve_pair(source, target)

    @property
    def can_rebind(self) -> bool:
        """True when the editor has compound directions for its concepts (rebind can propose)."""
        return "compound_table" in self._cpu

    def _resolve_pair(self, source: str, target: str | None) -> tuple[int, int]:
        if self.atom_level:
            raise LaceInputError("named edits act on whole concepts: use atom_level=False")
        source_index = self.directions.index(source)
        if target is None:
            target_index = NO_EDIT
        else:
            target_index = self.directions.index(target)
            if self.directions.groups[source_index] != self.directions.groups[target_index]:
                raise input_error(
                    "edit", "target",
                    f"a concept of the same type as '{source}' ({self.directions.groups[source_index]})",
                    f"{target} ({self.directions.groups[target_index]})",
                )
        owned = self.labelling.ownership(len(self.directions), self.tau_align).sum(0)
        for index in (source_index, target_index):
            if index >= 0 and owned[index] == 0:
                raise input_error(
                    "edit", "concept", f"a concept owning an atom aligned at tau_align={self.tau_align:.3f}",
                    self.directions.names[index],
                )
        return source_index, target_index

    @property
    def unit_names(self) -> list[str]:
        """Name of each edit unit: concept names, or 'concept#atom' at atom level."""
        if not self.atom_level:
            return list(self.directions.names)
        atoms = self.labelling.aligned(self.tau_align).nonzero().squeeze(1).tolist()
        return [f"{self.directions.names[int(self.labelling.atom_concept[k])]}#{k}" for k in atoms]

    @property
    def unit_atoms(self) -> list[list[int]]:
        """Atoms owned by each unit."""
        ownership_t = self._cpu["ownership_t"]
        return [row.nonzero().squeeze(1).tolist() for row in ownership_t]

    # ------------------------------------------------------------ public API
    def counterfactuals(self, z: Tensor, modality: str, n_edits: int, generator: torch.Generator | None = None) -> Counterfactuals:
        """M = n_edits dictionary edits of each of the B unit embeddings z (B, d).

        Returns embeddings (B, M, d), differentiable in z, with valid (B, M) and records.
        """
        plan = self._plan(z, modality, n_edits, generator)
        return self._finish(z, modality, plan, plan.step)

    def concept_arithmetic(self, z: Tensor, modality: str, n_edits: int, generator: torch.Generator | None = None) -> Counterfactuals:
        """The same edits moved along plain concept directions, same step sizes."""
        plan = self._plan(z, modality, n_edits, generator)
        return self._finish(z, modality, plan, self._arithmetic_step(plan))

    def random_control(self, z: Tensor, modality: str, n_edits: int, generator: torch.Generator | None = None) -> Counterfactuals:
        """The same edits' step sizes along random isotropic directions."""
        plan = self._plan(z, modality, n_edits, generator)
        return self._finish(z, modality, plan, self._random_step(plan, generator))

    def apply(self, z: Tensor, modality: str, edit: EditSpec | str, control: str | None = None,
              generator: torch.Generator | None = None) -> Counterfactuals:
        """One named edit ("transplant:sheep=zebra", "rebind:red=blue") on every embedding: M = 1.

        The source need only be present (weight > 0), not strongly used; a transplant
        target must be absent. A rebind needs both attributes and two objects present and
        exchanges the attributes between the objects they are bound to (the object pair
        read most clearly as bound, when there are several). control: None, "random" or
        "concept_arithmetic".
        """
        spec = parse_edit(edit) if isinstance(edit, str) else edit
        source, target = self._resolve_pair(spec.source, spec.target)
        if spec.kind == "rebind":
            if not self.can_rebind:
                raise input_error("edit", "rebind", "binding directions (a dictionary folder with bindings.json, "
                                  "concept-level edits)", spec.source + "=" + spec.target)
            if self.directions.kinds[source] != "attribute":
                raise input_error("edit", "rebind", "two attributes of the same group", f"{spec.source}, {spec.target}")
        plan = self._plan(z, modality, 1, generator, forced=(EDIT_KINDS.index(spec.kind), source, target))
        if control is None:
            step = plan.step
        elif control == "random":
            step = self._random_step(plan, generator)
        elif control == "concept_arithmetic":
            step = self._arithmetic_step(plan)
        else:
            raise input_error("apply", "control", "None, 'random' or 'concept_arithmetic'", control)
        return self._finish(z, modality, plan, step)

    # -------------------------------------------------------------- planning
    def _check_input(self, z: Tensor, modality: str) -> None:
        if modality not in MODALITIES:
            raise input_error("modality", None, f"one of {MODALITIES}", modality)
        dim = self._cpu["atoms"].shape[1]
        if z.ndim != 2 or z.shape[1] != dim:
            raise input_error("z", "shape", f"(B, {dim}) unit embeddings", tuple(z.shape))

    def _centre(self, z: Tensor, modality: str) -> tuple[Tensor, Tensor]:
        mean = self._buffers(z.device)["mean_" + modality].to(z.dtype)
        centred = z - mean
        norm = centred.norm(dim=-1)
        return centred / norm.clamp_min(1e-12).unsqueeze(-1), norm

    def _plan(self, z: Tensor, modality: str, n_edits: int, generator: torch.Generator | None,
              forced: tuple[int, int, int] | None = None) -> _Plan:
        self._check_input(z, modality)
        if n_edits < 1:
            raise input_error("n_edits", None, "at least one edit per embedding", n_edits)
        buffers = self._buffers(z.device)
        with torch.no_grad():
            centred, _ = self._centre(z.detach().float(), modality)  # (B, d)
            codes = encode(centred, buffers["atoms"], self.dictionary.sparsity, self.dictionary.method,
                           self.dictionary.nonnegative, dense=True, gram=buffers["gram"])  # (B, K)
            weights = concept_weights(codes, buffers["ownership"])  # (B, U)
            editable = editable_concepts(weights, self.tau_use) & buffers["has_atoms"]
            batch, n_units = weights.shape
            shape = (batch, n_edits)
            keys = _uniform((3, batch, n_edits, n_units), generator, z.device)
            kind_keys = _uniform((batch, n_edits, CODE_KINDS), generator, z.device)

            # a named pair (forced by `apply`, or the editor's target) fixes source and target;
            # `apply` asks only that the source be present, training asks that it be editable
            named = forced[1:] if forced is not None else self.named_pair
            usable = (weights > 0) if forced is not None else editable
            if named is None:
                source = _pick(editable.unsqueeze(1).expand(batch, n_edits, n_units), keys[0])
                has_source = editable.any(1, keepdim=True).expand(shape)
            else:
                source = torch.full(shape, named[0], dtype=torch.long, device=z.device)
                has_source = usable[:, named[0]].unsqueeze(1).expand(shape)
            if forced is not None:
                kind_enabled = torch.arange(len(EDIT_KINDS), device=z.device) == forced[0]
            else:
                kind_enabled = torch.tensor([k in self.kinds for k in EDIT_KINDS], device=z.device)

            compatible = buffers["compatible"][source]  # (B, M, U)
            source_weight = weights.gather(1, source)  # (B, M)
            swap_candidates = compatible & usable.unsqueeze(1)
            inactive_candidates = compatible & (weights <= 0).unsqueeze(1)
            if named is not None:
                only_target = torch.arange(n_units, device=z.device) == named[1]
                swap_candidates = swap_candidates & only_target
                inactive_candidates = inactive_candidates & only_target
            swap_target = _pick(swap_candidates, keys[1])
            if self.target == "hard":
                transplant_target = _pick(inactive_candidates, buffers["similarity"][source])
            else:
                transplant_target = _pick(inactive_candidates, keys[2])

            swap_target_weight = weights.gather(1, swap_target)
            gap = (source_weight - swap_target_weight).abs()
            swap_ok = swap_candidates.any(-1) & (gap > self.swap_min_gap * torch.maximum(source_weight, swap_target_weight))
            feasible = torch.stack(
                [has_source, has_source & swap_ok, has_source & inactive_candidates.any(-1)], dim=-1
            )  # (B, M, 3)
            # rebind draws its randomness after the code edits', so without it they are unchanged
            rebind = None
            rebind_enabled = forced[0] == REBIND if forced is not None else "rebind" in self.kinds
            if rebind_enabled and self.can_rebind:
                rebind = self._plan_rebind(centred, weights, editable, usable, named, n_edits, generator)
            if rebind is None:
                feasible = torch.cat([feasible, torch.zeros_like(feasible[..., :1])], dim=-1)
                kind_keys = torch.cat([kind_keys, torch.zeros_like(kind_keys[..., :1])], dim=-1)
            else:
                feasible = torch.cat([feasible, rebind.proposed.unsqueeze(-1)], dim=-1)
                kind_keys = torch.cat([kind_keys, _uniform((batch, n_edits, 1), generator, z.device)], dim=-1)
            feasible = feasible & kind_enabled  # (B, M, 4)
            kind = _pick(feasible, kind_keys)
            proposed = feasible.any(-1)
            kind = torch.where(proposed, kind, torch.full_like(kind, NO_EDIT))
            target = torch.where(kind == SWAP, swap_target, torch.where(kind == TRANSPLANT, transplant_target, NO_EDIT))
            if rebind is not None:
                is_rebind = kind == REBIND
                source = torch.where(is_rebind, rebind.attributes[..., 0], source)
                target = torch.where(is_rebind, rebind.attributes[..., 1], target)
                source_weight = weights.gather(1, source)
            target_weight = torch.where(target >= 0, weights.gather(1, target.clamp_min(0)), torch.zeros_like(source_weight))

            # a' - a = a * (source atoms * source_coef + target atoms * target_coef) + transplant mass
            safe_source = source_weight.clamp_min(1e-12)
            safe_target = target_weight.clamp_min(1e-12)
            source_coef = torch.where(kind == ATTENUATE, torch.full_like(source_weight, self.gamma - 1.0),
                                      torch.where(kind == SWAP, target_weight / safe_source - 1.0, -torch.ones_like(source_weight)))
            target_coef = torch.where(kind == SWAP, source_weight / safe_target - 1.0, torch.zeros_like(source_weight))
            edits_code = proposed & (kind != REBIND)
            source_coef = source_coef * edits_code
            target_coef = target_coef * edits_code
            transplant_mass = torch.where(kind == TRANSPLANT, self.strength * source_weight, torch.zeros_like(source_weight))
            source_atoms = buffers["ownership_t"][source]  # (B, M, K)
            target_atoms = buffers["ownership_t"][target.clamp_min(0)] * (target >= 0).unsqueeze(-1)
            delta = codes.unsqueeze(1) * (source_atoms * source_coef.unsqueeze(-1) + target_atoms * target_coef.unsqueeze(-1))
            delta = delta + transplant_mass.unsqueeze(-1) * buffers["transplant_pattern"][target.clamp_min(0)]
            edited = codes.unsqueeze(1) + delta  # (B, M, K)
            step = delta @ buffers["atoms"]  # (B, M, d)
            if rebind is not None:  # a rebind leaves the code as it is and moves along compound directions
                step = torch.where((kind == REBIND).unsqueeze(-1), rebind.step, step)
            after = ((edited * source_atoms).sum(-1), (edited * target_atoms).sum(-1))
        return _Plan(centred, kind, source, target, proposed, step, step.norm(dim=-1),
                     (source_weight, target_weight), after, rebind)

    def _plan_rebind(self, centred: Tensor, weights: Tensor, editable: Tensor, usable: Tensor,
                     named: tuple[int, int] | None, n_edits: int,
                     generator: torch.Generator | None) -> RebindPlan | None:
        """Rebind proposals for every slot, or None when the named pair is not two attributes."""
        buffers = self._buffers(centred.device)
        if named is not None and any(self.directions.kinds[i] != "attribute" for i in named):
            return None
        draws = None if named is not None else _uniform((centred.shape[0], n_edits), generator, centred.device)
        # the attributes are `usable` (present suffices for a named `apply`); the objects, which
        # the editor picks itself, must be strongly used, so a stray small weight never takes part
        return plan_rebind(centred, weights, usable & buffers["has_atoms"], editable, buffers["is_attribute"],
                           buffers["is_object"], buffers["group_ids"], buffers["compound_index"],
                           buffers["compound_table"], n_edits, self.strength, draws, named)

    # ---------------------------------------------------------- rebuild, check
    def _rebuild(self, z: Tensor, modality: str, step: Tensor) -> Tensor:
        centred, norm = self._centre(z, modality)  # differentiable in z
        direction = centred.unsqueeze(1) + step.to(centred.dtype)  # (B, M, d)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        mean = self._buffers(z.device)["mean_" + modality].to(z.dtype)
        rebuilt = mean + norm.unsqueeze(-1).unsqueeze(-1) * direction
        return rebuilt / rebuilt.norm(dim=-1, keepdim=True)

    def _passes(self, plan: _Plan, rebuilt: Tensor, modality: str) -> Tensor:
        """(B, M) bool effect check of rebuilt embeddings (B, M, d)."""
        buffers = self._buffers(rebuilt.device)
        with torch.no_grad():
            after, _ = self._centre(rebuilt.detach().float(), modality)
            source_direction = buffers["unit_directions"][plan.source]  # (B, M, d)
            target_direction = buffers["unit_directions"][plan.target.clamp_min(0)]
            before = plan.centred.unsqueeze(1)
            source_before = (before * source_direction).sum(-1)
            source_after = (after * source_direction).sum(-1)
            target_before = (before * target_direction).sum(-1)
            target_after = (after * target_direction).sum(-1)
            attenuated = source_before - source_after >= self.attenuate_margin
            transplanted = (target_after > target_before) & (source_after < source_before)
            swapped = (source_before - target_before) * (source_after - target_after) < 0
            passed = torch.where(plan.kind == ATTENUATE, attenuated, torch.where(plan.kind == SWAP, swapped, transplanted))
            if plan.rebind is not None:
                rebound = binding_margin(after, plan.rebind.compounds, buffers["compound_table"]) < 0
                passed = torch.where(plan.kind == REBIND, rebound, passed)
        return passed & plan.proposed

    def _finish(self, z: Tensor, modality: str, plan: _Plan, step: Tensor) -> Counterfactuals:
        rebuilt = self._rebuild(z, modality, step)
        passed = self._passes(plan, rebuilt, modality)
        if step is plan.step:
            edit_passed = passed
        else:  # a control keeps the slots of the dictionary edit it mirrors
            edit_passed = self._passes(plan, self._rebuild(z.detach(), modality, plan.step), modality)
        valid = plan.proposed & (edit_passed if self.effect_check else torch.ones_like(edit_passed))
        records = EditRecords(
            kind=plan.kind, source=plan.source, target=plan.target,
            source_weight_before=plan.weights_before[0], source_weight_after=plan.weights_after[0],
            target_weight_before=plan.weights_before[1], target_weight_after=plan.weights_after[1],
            step_size=plan.step_size, proposed=plan.proposed, passed_check=passed,
            objects=self._rebind_objects(plan),
        )
        return Counterfactuals(rebuilt, valid, records)

    def _rebind_objects(self, plan: _Plan) -> Tensor | None:
        if plan.rebind is None:
            return None
        is_rebind = (plan.kind == REBIND).unsqueeze(-1)
        return torch.where(is_rebind, plan.rebind.objects, torch.full_like(plan.rebind.objects, NO_EDIT))

    # -------------------------------------------------------------- controls
    def _random_step(self, plan: _Plan, generator: torch.Generator | None) -> Tensor:
        noise = _normal(tuple(plan.step.shape), generator, plan.step.device)
        return noise / noise.norm(dim=-1, keepdim=True).clamp_min(1e-12) * plan.step_size.unsqueeze(-1)

    def _arithmetic_step(self, plan: _Plan) -> Tensor:
        buffers = self._buffers(plan.step.device)
        source_direction = buffers["unit_directions"][plan.source]
        target_direction = buffers["unit_directions"][plan.target.clamp_min(0)]
        towards_target = target_direction - source_direction
        # a swap moves weight from the heavier concept to the lighter one
        sign = torch.where(plan.weights_before[0] >= plan.weights_before[1], 1.0, -1.0).unsqueeze(-1)
        direction = torch.where((plan.kind == ATTENUATE).unsqueeze(-1), -source_direction,
                                torch.where((plan.kind == SWAP).unsqueeze(-1), sign * towards_target, towards_target))
        # a rebind is made of concept (compound) directions already: its arithmetic twin is itself
        direction = torch.where((plan.kind == REBIND).unsqueeze(-1), plan.step, direction)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return direction * plan.step_size.unsqueeze(-1)


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    source_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=source_device).to(device)


def _normal(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    source_device = generator.device if generator is not None else device
    return torch.randn(shape, generator=generator, device=source_device).to(device)


def _pick(candidates: Tensor, scores: Tensor) -> Tensor:
    """Index of the best-scoring candidate along the last axis (0 where there is none)."""
    return torch.where(candidates, scores, torch.full_like(scores, -float("inf"))).argmax(-1)

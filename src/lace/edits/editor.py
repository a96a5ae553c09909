"""Counterfactual embeddings by editing sparse concept codes, batched: B embeddings x M edits.

For each embedding z (unit, modality m) the dictionary gives c_hat = (z - mu_m) / |z - mu_m|
and its code a (frozen dictionary, no gradient). An edit turns a into a'; the rebuilt
embedding is

    c_hat' = c_hat + (a' - a) D,     z' = normalize(mu_m + |c| c_hat' / |c_hat'|),

so the residual c_hat - a D is kept, and z' is a differentiable function of z with the step
(a' - a) D held constant. Centring, coding and rebuilding are the dictionary's own
(`ConceptDictionary.centre`, `.code_directions`, `.decode_directions`).

The work is split by job:
- `lace.edits.kernels`: what each kind (attenuate, swap, transplant) does to a code, and its
  effect check on readouts r_c = cos(c_hat, e_c); `lace.edits.rebind` for rebind;
- `lace.edits.planner`: which unit, kind and target each slot gets (`EditConfig` decides);
- `lace.edits.controls`: the random and concept-arithmetic controls of the same edits;
- this estimator-style object: holds the dictionary and labelling and runs the three.
Edits act on whole concepts by default, on single aligned atoms with `atom_level`.
Slot kinds are drawn uniformly among the enabled kinds feasible for that slot. Pass
generators seeded alike to get the same edits from `counterfactuals` and its controls; pass
`RowGenerators` (one per row) to make each row's edits independent of the batch it is in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lace.concepts.bindings import BindingDirections
from lace.concepts.directions import ConceptDirections
from lace.concepts.labelling import AtomLabelling
from lace.dictionary.concept_dictionary import MODALITIES, ConceptDictionary
from lace.edits import controls, kernels
from lace.edits.config import TARGET_MODES, EditConfig
from lace.edits.kernels import ATTENUATE, REBIND, SWAP
from lace.edits.names import concept_error
from lace.edits.planner import EditPlan, EditPlanner
from lace.edits.rebind import binding_margin
from lace.edits.records import EDIT_KINDS, NO_EDIT, Counterfactuals, EditRecords
from lace.edits.spec import EditSpec, parse_edit, parse_pair
from lace.errors import LaceInputError, input_error
from lace.row_random import Randomness


class CounterfactualEditor:
    """Makes counterfactual embeddings from a frozen `ConceptDictionary`.

    config: every knob (`EditConfig`); bindings: compound directions for rebind (None: rebind
    proposes nothing). Build one from a labelled dictionary with `lace.edits.build_editor`.
    """

    def __init__(self, dictionary: ConceptDictionary, labelling: AtomLabelling, directions: ConceptDirections,
                 config: EditConfig | None = None, bindings: BindingDirections | None = None):
        config = (config or EditConfig()).validate("CounterfactualEditor")
        dim = dictionary.atoms_.shape[1]
        if directions.directions.shape[1] != dim:
            raise input_error("concept directions", "directions", f"dimension {dim}", directions.directions.shape[1])
        if bindings is not None and len(bindings) and bindings.dim != dim:
            raise input_error("binding directions", "directions", f"dimension {dim}", bindings.dim)
        self.dictionary = dictionary
        self.labelling = labelling
        self.directions = directions
        self.config = config
        self.bindings = bindings
        self.tau_align = labelling.tau_align if config.tau_align is None else config.tau_align
        self.planner = EditPlanner(dictionary.atoms_.float(), labelling, directions, config, self.tau_align, bindings)
        named = None if config.target in TARGET_MODES else parse_pair(config.target, "target")
        self.named_pair = None if named is None else self._resolve_pair(*named)
        if not bool(self.planner.tables(torch.device("cpu"))["has_atoms"].any()):
            raise input_error(
                "CounterfactualEditor", "tau_align", "a threshold at which some atom is aligned with a concept",
                f"{self.tau_align:.3f}, best alignment {float(labelling.atom_alignment.max()):.3f}",
            )

    # --------------------------------------------------------------- units
    @property
    def can_rebind(self) -> bool:
        """True when the editor has compound directions for its concepts (rebind can propose)."""
        return self.planner.can_rebind

    @property
    def unit_names(self) -> list[str]:
        """Name of each edit unit: concept names, or 'concept#atom' at atom level."""
        if not self.config.atom_level:
            return list(self.directions.names)
        atoms = self.labelling.aligned(self.tau_align).nonzero().squeeze(1).tolist()
        return [f"{self.directions.names[int(self.labelling.atom_concept[k])]}#{k}" for k in atoms]

    @property
    def unit_atoms(self) -> list[list[int]]:
        """Atoms owned by each unit."""
        ownership_t = self.planner.tables(torch.device("cpu"))["ownership_t"]
        return [row.nonzero().squeeze(1).tolist() for row in ownership_t]

    @property
    def editable_concepts(self) -> list[str]:
        """Names of the concepts owning an atom aligned at `tau_align` (only those can be edited)."""
        owned = self.labelling.ownership(len(self.directions), self.tau_align).sum(0)
        return [name for name, count in zip(self.directions.names, owned.tolist()) if count > 0]

    def _concept_index(self, name: str) -> int:
        if name not in self.directions.names:
            raise concept_error(name, f"is not one of the {len(self.directions)} known concepts of the dictionary",
                                self.editable_concepts)
        return self.directions.index(name)

    def _resolve_pair(self, source: str, target: str | None) -> tuple[int, int]:
        if self.config.atom_level:
            raise LaceInputError("named edits act on whole concepts: use atom_level=False")
        source_index = self._concept_index(source)
        if target is None:
            target_index = NO_EDIT
        else:
            target_index = self._concept_index(target)
            if self.directions.groups[source_index] != self.directions.groups[target_index]:
                raise input_error(
                    "edit", "target",
                    f"a concept of the same type as '{source}' ({self.directions.groups[source_index]})",
                    f"{target} ({self.directions.groups[target_index]})",
                )
        editable = self.editable_concepts
        for index in (source_index, target_index):
            if index >= 0 and self.directions.names[index] not in editable:
                raise concept_error(self.directions.names[index],
                                    f"owns no atom aligned at tau_align={self.tau_align:.3f}, so it cannot be edited",
                                    editable)
        return source_index, target_index

    # ------------------------------------------------------------ public API
    def counterfactuals(self, z: Tensor, modality: str, n_edits: int, generator: Randomness = None) -> Counterfactuals:
        """M = n_edits dictionary edits of each of the B unit embeddings z (B, d).

        Returns embeddings (B, M, d), differentiable in z, with valid (B, M) and records.
        """
        return self._edit(z, modality, self._plan(z, modality, n_edits, generator), None, generator)

    def concept_arithmetic(self, z: Tensor, modality: str, n_edits: int, generator: Randomness = None) -> Counterfactuals:
        """The same edits moved along plain concept directions, same step sizes."""
        return self._edit(z, modality, self._plan(z, modality, n_edits, generator), "concept_arithmetic", generator)

    def random_control(self, z: Tensor, modality: str, n_edits: int, generator: Randomness = None) -> Counterfactuals:
        """The same edits' step sizes along random isotropic directions."""
        return self._edit(z, modality, self._plan(z, modality, n_edits, generator), "random", generator)

    def apply(self, z: Tensor, modality: str, edit: EditSpec | str, control: str | None = None,
              generator: Randomness = None) -> Counterfactuals:
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
        if control is not None and control not in controls.CONTROLS:
            raise input_error("apply", "control", "None, 'random' or 'concept_arithmetic'", control)
        plan = self._plan(z, modality, 1, generator, (source, target), EDIT_KINDS.index(spec.kind))
        return self._edit(z, modality, plan, control, generator)

    # -------------------------------------------------------------- planning
    def _plan(self, z: Tensor, modality: str, n_edits: int, generator: Randomness,
              named: tuple[int, int] | None = None, forced_kind: int | None = None) -> EditPlan:
        if modality not in MODALITIES:
            raise input_error("modality", None, f"one of {MODALITIES}", modality)
        dim = self.dictionary.atoms_.shape[1]
        if z.ndim != 2 or z.shape[1] != dim:
            raise input_error("z", "shape", f"(B, {dim}) unit embeddings", tuple(z.shape))
        if n_edits < 1:
            raise input_error("n_edits", None, "at least one edit per embedding", n_edits)
        with torch.no_grad():
            centred, _ = self.dictionary.centre(z.detach().float(), modality)  # (B, d)
            codes = self.dictionary.code_directions(centred, dense=True)  # (B, K)
            return self.planner.plan(centred, codes, n_edits, generator, named or self.named_pair, forced_kind)

    # ---------------------------------------------------------- rebuild, check
    def _rebuild(self, z: Tensor, modality: str, step: Tensor) -> Tensor:
        """(B, M, d) unit embeddings: the dictionary's rebuild of c_hat + step, differentiable in z."""
        centred, norm = self.dictionary.centre(z, modality)
        return self.dictionary.decode_directions(centred.unsqueeze(1) + step.to(centred.dtype), modality,
                                                 norm.unsqueeze(-1))

    def _readouts(self, plan: EditPlan, rebuilt: Tensor, modality: str) -> tuple[Tensor, ...]:
        """Source and target readouts (B, M) before and after, and c_hat after (B, M, d)."""
        tables = self.planner.tables(rebuilt.device)
        flat = rebuilt.detach().float()
        after = self.dictionary.centre(flat.reshape(-1, flat.shape[-1]), modality)[0].reshape(flat.shape)
        source_direction = tables["unit_directions"][plan.source]  # (B, M, d)
        target_direction = tables["unit_directions"][plan.target.clamp_min(0)]
        before = plan.centred.unsqueeze(1)
        return ((before * source_direction).sum(-1), (after * source_direction).sum(-1),
                (before * target_direction).sum(-1), (after * target_direction).sum(-1), after)

    def _passes(self, plan: EditPlan, rebuilt: Tensor, modality: str) -> Tensor:
        """(B, M) bool effect check of rebuilt embeddings (B, M, d), through the per-kind kernels."""
        with torch.no_grad():
            source_before, source_after, target_before, target_after, after = self._readouts(plan, rebuilt, modality)
            attenuated = kernels.attenuated(source_before, source_after, self.config.attenuate_margin)
            transplanted = kernels.transplanted(source_before, source_after, target_before, target_after)
            swapped = kernels.swapped(source_before, source_after, target_before, target_after)
            passed = torch.where(plan.kind == ATTENUATE, attenuated, torch.where(plan.kind == SWAP, swapped, transplanted))
            if plan.rebind is not None:
                table = self.planner.tables(rebuilt.device)["compound_table"]
                rebound = binding_margin(after, plan.rebind.compounds, table) < 0
                passed = torch.where(plan.kind == REBIND, rebound, passed)
        return passed & plan.proposed

    def _control_step(self, plan: EditPlan, control: str | None, generator: Randomness) -> Tensor:
        """The step of the edit itself (control None) or of one of its controls (`lace.edits.controls`)."""
        if control is None:
            return plan.step
        if control == "random":
            return controls.random_step(plan.step, plan.step_size, generator)
        tables = self.planner.tables(plan.step.device)
        return controls.arithmetic_step(plan.kind, plan.step, plan.step_size, tables["unit_directions"][plan.source],
                                        tables["unit_directions"][plan.target.clamp_min(0)], *plan.weights_before)

    def _edit(self, z: Tensor, modality: str, plan: EditPlan, control: str | None,
              generator: Randomness) -> Counterfactuals:
        step = self._control_step(plan, control, generator)
        rebuilt = self._rebuild(z, modality, step)
        passed = self._passes(plan, rebuilt, modality)
        if control is None:
            edit_passed = passed
        else:  # a control keeps the slots of the dictionary edit it mirrors
            edit_passed = self._passes(plan, self._rebuild(z.detach(), modality, plan.step), modality)
        valid = plan.proposed & (edit_passed if self.config.effect_check else torch.ones_like(edit_passed))
        records = EditRecords(
            kind=plan.kind, source=plan.source, target=plan.target,
            source_weight_before=plan.weights_before[0], source_weight_after=plan.weights_after[0],
            target_weight_before=plan.weights_before[1], target_weight_after=plan.weights_after[1],
            step_size=plan.step_size, proposed=plan.proposed, passed_check=passed,
            objects=self._rebind_objects(plan),
        )
        return Counterfactuals(rebuilt, valid, records)

    def _rebind_objects(self, plan: EditPlan) -> Tensor | None:
        if plan.rebind is None:
            return None
        is_rebind = (plan.kind == REBIND).unsqueeze(-1)
        return torch.where(is_rebind, plan.rebind.objects, torch.full_like(plan.rebind.objects, NO_EDIT))

"""A learnt recolouring operator at L: the ridge regression's change plus a small per-position network.

The ridge regression (`lace.local.recolour.RecolourRegression`) predicts the mean change of a position when its
object is repainted, from its 3x3 neighbourhood; a linear probe on the embeddings still tells its edits from real
images. This operator learns on the same self-supervision (the tower's own features before and after a
grey-preserving colour map of the pixels, `recolour_examples`):

    change(n_p, a, b) = ridge_ab(n_p) + residual(n_p, a, b)

where the residual is a two-layer MLP on the standardised neighbourhood n_p plus embeddings of the source and
target concepts, its output layer zero at the start (so the fit starts from the ridge). It is trained on a seeded
sample of positions per pair with the reconstruction loss (relative squared error of the change) and, weighted by
`adversarial_weight`, the non-saturating loss of fooling a per-position discriminator that tells the repainted
map's features at a position (real) from the edited ones, given the target concept. Everything is seeded and runs
on the CPU in seconds; the global random stream is left as it was.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lace.local.config import LearntOperatorConfig
from lace.local.reader import PositionConceptReader
from lace.local.recolour import (
    RecolourRegression,
    move_near_object,
    recolour_examples,
    ridge_change,
)


class RidgeMap(nn.Module):
    """The ridge regression as a network: forward(inputs (K, D), pair (K,) sorted codes a G + b) -> change (K, C).

    stacked: (G G, D + 1, C) every ordered pair's weights (`RecolourRegression._stacked`)."""

    def __init__(self, stacked: Tensor):
        super().__init__()
        self.register_buffer("weights", stacked.detach().clone())

    def forward(self, inputs: Tensor, pair: Tensor) -> Tensor:
        return ridge_change(self.weights, inputs, pair)


class RecolourNetwork(nn.Module):
    """The ridge map's change plus a residual MLP conditioned on the concept pair.

    stacked (G G, D + 1, C): the ridge weights; input_mean, input_scale (D,): the neighbourhoods' standardisation;
    forward(inputs (K, D), pair (K,) sorted codes a G + b) -> change (K, C)."""

    def __init__(self, stacked: Tensor, n_concepts: int, hidden: int, input_mean: Tensor, input_scale: Tensor):
        super().__init__()
        in_dim, channels = stacked.shape[1] - 1, stacked.shape[2]
        self.n_concepts = n_concepts
        self.ridge = RidgeMap(stacked)
        self.register_buffer("input_mean", input_mean.detach().clone())
        self.register_buffer("input_scale", input_scale.detach().clone())
        self.source = nn.Embedding(n_concepts, hidden)
        self.target = nn.Embedding(n_concepts, hidden)
        self.first = nn.Linear(in_dim, hidden)
        self.second = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, channels)
        nn.init.zeros_(self.out.weight)  # the fit starts from the ridge regression
        nn.init.zeros_(self.out.bias)
        # (G G,) the pairs it learns (those the ridge learnt; a grey source on photographs never is one): on the
        # others, never trained, it adds nothing, so they stay as unmoved as the ridge leaves them
        self.register_buffer("learnt_pairs", learnt_rows(stacked))

    def residual(self, inputs: Tensor, pair: Tensor) -> Tensor:
        """(K, D), (K,) -> (K, C) what the network adds to the ridge's change."""
        standard = (inputs - self.input_mean) / self.input_scale
        hidden = F.gelu(self.first(standard) + self.source(pair // self.n_concepts)
                        + self.target(pair % self.n_concepts))
        return self.out(F.gelu(self.second(hidden)))

    def forward(self, inputs: Tensor, pair: Tensor) -> Tensor:
        known = self.learnt_pairs[pair].to(inputs.dtype)[:, None]  # (K, 1)
        return self.ridge(inputs, pair) + self.residual(inputs, pair) * known


def learnt_rows(stacked: Tensor) -> Tensor:
    """(G G, D + 1, C) stacked ridge weights -> (G G,) bool, the ordered pairs the ridge learnt (zero: never)."""
    return stacked.detach().flatten(1).abs().amax(1) > 0


class PositionDiscriminator(nn.Module):
    """Real-vs-edited logit of a position's features (K, C) at L given its target concept (K,)."""

    def __init__(self, channels: int, n_concepts: int, hidden: int, mean: Tensor, scale: Tensor):
        super().__init__()
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("scale", scale.detach().clone())
        self.concept = nn.Embedding(n_concepts, hidden)
        self.first = nn.Linear(channels, hidden)
        self.second = nn.Linear(hidden, 1)

    def forward(self, features: Tensor, concept: Tensor) -> Tensor:
        hidden = F.leaky_relu(self.first((features - self.mean) / self.scale) + self.concept(concept), 0.2)
        return self.second(hidden).squeeze(-1)


class LearntRecolour:
    """The learnt recolouring operator (`move` as `RecolourRegression.move`, the change given by `network_`).

    config: its knobs (`LearntOperatorConfig`); seed: the positions sampled, the initial weights and the batches;
    window, ridge, min_coverage: as `RecolourRegression`'s. Learned state: `ridge_` the fitted regression (in the
    process that fitted it), `network_` a `RecolourNetwork`, `n_concepts_` G, `fit_figures_` the relative
    reconstruction error of the ridge and of the network on the sampled positions and the last discriminator loss.
    """

    def __init__(self, config: LearntOperatorConfig | None = None, seed: int = 0, window: int = 3,
                 ridge: float = 1e-3, min_coverage: float = 0.02):
        self.config = (config or LearntOperatorConfig()).validate()
        self.seed, self.window, self.ridge, self.min_coverage = seed, window, ridge, min_coverage

    def fit(self, clip: torch.nn.Module, layer: str, raw_pixels: Tensor, normalise, reader: PositionConceptReader,
            prototypes: Tensor, locate_layer: str | None = None, batch_size: int = 500) -> LearntRecolour:
        """raw_pixels (N, 3, H, W) in [0, 1]; normalise: raw -> model input; prototypes (G, 3) RGB in [0, 1]."""
        examples = recolour_examples(clip, layer, raw_pixels, normalise, reader, prototypes, locate_layer,
                                     self.window, self.min_coverage, batch_size)
        return self.fit_examples(examples, len(prototypes))

    def fit_examples(self, examples, n_concepts: int) -> LearntRecolour:
        """Fit on `recolour_examples`' (source, target, neighbourhoods (n, D), change (n, C)) of G concepts: the
        ridge on all of them, the network on `rows_per_pair` positions of each pair drawn with the seed."""
        self.n_concepts_ = n_concepts
        sampler = torch.Generator().manual_seed(self.seed)
        pool: list[tuple[Tensor, Tensor, Tensor]] = []

        def sampled(stream):
            for source, target, described, change in stream:
                keep = torch.randperm(len(described), generator=sampler)[:self.config.rows_per_pair]
                keep = keep.to(described.device)
                pool.append((torch.full((len(keep),), source * n_concepts + target, dtype=torch.long),
                             described[keep].float().cpu(), change[keep].float().cpu()))
                yield source, target, described, change

        self.ridge_ = RecolourRegression(self.window, self.ridge, self.min_coverage).fit_examples(
            sampled(examples), n_concepts)
        pair, inputs, change = (torch.cat(parts) for parts in zip(*pool))
        self.network_ = self._train(self.ridge_._stacked().float().cpu(), pair, inputs, change)
        return self

    def _train(self, stacked: Tensor, pair: Tensor, inputs: Tensor, change: Tensor) -> RecolourNetwork:
        """The network fitted on the sampled rows: pair (K,), inputs (K, D), change (K, C). Runs on one thread:
        its matrices are small, so more threads only wait on each other (on a busy machine, minutes instead of
        seconds), and the fit is then the same whatever the run's thread count."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._train_one_thread(stacked, pair, inputs, change)
        finally:
            torch.set_num_threads(threads)

    def _train_one_thread(self, stacked: Tensor, pair: Tensor, inputs: Tensor, change: Tensor) -> RecolourNetwork:
        config, n_concepts = self.config, self.n_concepts_
        centre = inputs[:, (self.window ** 2 // 2) * change.shape[1]:][:, :change.shape[1]]  # (K, C)
        real = centre + change
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            network = RecolourNetwork(stacked, n_concepts, config.hidden, inputs.mean(0),
                                      inputs.std(0).clamp_min(1e-6))
            network.learnt_pairs[pair.unique()] = True  # the pairs it is trained on
            critic = PositionDiscriminator(change.shape[1], n_concepts, config.hidden, real.mean(0),
                                           real.std(0).clamp_min(1e-6))
        trained = [p for p in network.parameters() if p.requires_grad]
        optimiser = torch.optim.Adam(trained, lr=config.lr)
        critic_optimiser = torch.optim.Adam(critic.parameters(), lr=config.lr)
        batches = torch.Generator().manual_seed(self.seed + 1)
        energy = change.pow(2).sum(1).mean().clamp_min(1e-12)
        critic_loss = torch.zeros(())
        with torch.enable_grad():  # a fit called under no_grad (a measurement) still trains
            for _ in range(config.steps):
                rows = torch.randint(len(pair), (config.positions_per_step,), generator=batches)
                codes, order = pair[rows].sort(stable=True)
                rows = rows[order]
                predicted = network(inputs[rows], codes)
                edited, concept = centre[rows] + predicted, codes % n_concepts
                loss = (predicted - change[rows]).pow(2).sum(1).mean() / energy
                if config.adversarial_weight > 0:
                    critic_loss = _critic_step(critic, critic_optimiser, real[rows], edited.detach(), concept)
                    fooled = critic(edited, concept)
                    loss = loss + config.adversarial_weight * F.binary_cross_entropy_with_logits(
                        fooled, torch.ones_like(fooled))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        self.fit_figures_ = self._figures(network, pair, inputs, change, energy, float(critic_loss))
        return network.eval().requires_grad_(False)

    @staticmethod
    def _figures(network: RecolourNetwork, pair: Tensor, inputs: Tensor, change: Tensor, energy: Tensor,
                 critic_loss: float) -> dict[str, float]:
        """Relative reconstruction error of the ridge and the fitted network on the sampled rows (training rows)."""
        codes, order = pair.sort()
        with torch.no_grad():
            ridge = network.ridge(inputs[order], codes)
            learnt = ridge + network.residual(inputs[order], codes)
        return {"ridge_reconstruction": float((ridge - change[order]).pow(2).sum(1).mean() / energy),
                "learnt_reconstruction": float((learnt - change[order]).pow(2).sum(1).mean() / energy),
                "critic_loss": critic_loss}

    def move(self, features: Tensor, grid: tuple[int, int], coverage: Tensor, source: Tensor,
             target: Tensor) -> Tensor:
        """The step (B, P, C) that recolours each image's object (coverage (B, P)) from `source` to `target` (B,),
        at the positions `RecolourRegression.move` moves, by `network_`'s change."""
        network = self.network_.to(features.device)
        return move_near_object(network, features, grid, coverage, source, target, self.window,
                                self.min_coverage, self.n_concepts_)

    def state_dict(self) -> dict:
        """The fitted operator as plain tensors and numbers (its knobs, G and the network's tensors)."""
        network = self.network_
        return {"window": self.window, "ridge": self.ridge, "min_coverage": self.min_coverage, "seed": self.seed,
                "config": dict(vars(self.config)), "n_concepts": self.n_concepts_,
                "network": {name: value.detach().cpu() for name, value in network.state_dict().items()}}

    @classmethod
    def from_state(cls, state: dict) -> LearntRecolour:
        """The fitted operator `state_dict()` describes, its network as it was saved."""
        operator = cls(LearntOperatorConfig(**state["config"]), state["seed"], state["window"], state["ridge"],
                       state["min_coverage"])
        operator.n_concepts_ = int(state["n_concepts"])
        tensors = state["network"]
        tensors = {"learnt_pairs": learnt_rows(tensors["ridge.weights"]), **tensors}  # saved before it was kept
        with torch.random.fork_rng(devices=[]):  # its layers' initial draws, overwritten below, leave the stream alone
            network = RecolourNetwork(tensors["ridge.weights"], operator.n_concepts_, operator.config.hidden,
                                      tensors["input_mean"], tensors["input_scale"])
        network.load_state_dict(tensors)
        operator.network_ = network.eval().requires_grad_(False)
        return operator


def _critic_step(critic: PositionDiscriminator, optimiser: torch.optim.Optimizer, real: Tensor, edited: Tensor,
                 concept: Tensor) -> Tensor:
    """One step of the discriminator on real (K, C) and edited (K, C) features; its loss."""
    logits = critic(torch.cat([real, edited]), torch.cat([concept, concept]))
    labels = torch.cat([torch.ones(len(real)), torch.zeros(len(edited))])
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    return loss.detach()


__all__ = ["LearntRecolour", "PositionDiscriminator", "RecolourNetwork", "RidgeMap"]

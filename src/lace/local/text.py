"""Caption-side binding swaps on token states at layer L of the text tower.

The concepts a caption names sit at its own tokens, so they are found from the token ids (the
caption is the input, not an annotation): a group's concept words that the tokenizer keeps as one
token. A binding swap exchanges the states of the first two such tokens at L, each keeping its own
position's embedding (`s_i' = s_j - pos_j + pos_i`); at block0 that is exactly the caption with the
two words exchanged, above it the states also carry context, which the swap moves along.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lace.local.towers import TextTowerSplit


def single_token_ids(tokenize, names: list[str]) -> Tensor:
    """(G,) the token id of each concept name, -1 where the tokenizer splits it into several tokens."""
    ids = []
    for name in names:
        tokens = tokenize([name])[0]
        content = tokens[1 : int(tokens.argmax())]  # between start and end of text
        ids.append(int(content[0]) if len(content) == 1 else -1)
    return torch.tensor(ids)


@dataclass
class ConceptTokens:
    """positions (B, 2) of the first two concept tokens; concept (B, 2) their index in the group; valid (B,)."""

    positions: Tensor
    concept: Tensor
    valid: Tensor


def find_concept_tokens(tokens: Tensor, concept_ids: Tensor) -> ConceptTokens:
    """(B, T) token ids -> the first two tokens that are concept words of the group, with different concepts."""
    matches = tokens[..., None] == concept_ids[None, None, :].clamp_min(-1).to(tokens.device)  # (B, T, G)
    matches &= (concept_ids >= 0).to(tokens.device)
    is_concept = matches.any(dim=-1)  # (B, T)
    order = torch.where(is_concept, torch.arange(tokens.shape[1], device=tokens.device), tokens.shape[1])
    positions = order.sort(dim=1).values[:, :2].clamp_max(tokens.shape[1] - 1)  # (B, 2)
    concept = matches.float().argmax(dim=-1).gather(1, positions)
    found = is_concept.gather(1, positions).all(dim=1)
    return ConceptTokens(positions, concept, found & (concept[:, 0] != concept[:, 1]))


def swap_token_states(split: TextTowerSplit, states: Tensor, found: ConceptTokens) -> Tensor:
    """States (B, T, C) with the two found tokens' states exchanged (own positional embeddings kept)."""
    positional = split.clip.positional_embedding.to(states.dtype)  # (T, C)
    rows = torch.arange(states.shape[0], device=states.device)
    first, second = found.positions[:, 0], found.positions[:, 1]
    state_first, state_second = states[rows, first], states[rows, second]
    step = torch.zeros_like(states)
    new_first = state_second - positional[second] + positional[first]
    new_second = state_first - positional[first] + positional[second]
    step[rows, first] = (new_first - state_first).detach()
    step[rows, second] = (new_second - state_second).detach()
    return states + step * found.valid[:, None, None]


def caption_swap_negatives(clip: torch.nn.Module, tokens: Tensor, concept_ids: Tensor, layer: str) -> tuple[Tensor, Tensor]:
    """(B, T) tokens -> (B, 1, d) unit caption negatives (binding swap at `layer`, with gradient) and (B, 1) valid."""
    split = TextTowerSplit(clip, layer)
    states = split.lower(tokens)
    found = find_concept_tokens(tokens, concept_ids)
    embeddings = split.upper(swap_token_states(split, states, found), tokens)
    return embeddings[:, None], found.valid[:, None]

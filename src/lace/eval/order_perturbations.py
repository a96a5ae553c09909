"""The four word-order perturbations of ARO's COCO-Order and Flickr30k-Order.

As in the original (`dataset_zoo/perturbations.py` of vision-language-models-are-bows):
shuffle nouns and adjectives (each class among itself), shuffle everything but nouns and
adjectives, shuffle words within each trigram, shuffle the trigrams; then BLIP's
`pre_caption` (lower case, punctuation dropped, at most 30 words).

Two taggers. `SpacyTagger` tags as the original does (spaCy's `en_core_web_sm`, Penn tags
NN* are nouns and JJ* adjectives); it needs spaCy, which lace does not install. The
default `VocabularyTagger` is a deviation: nouns are the vocabulary's object words
(plurals included) and adjectives its attribute words, found with the same phrase matcher
as the rule-made negatives; other words count as neither. With the natural vocabulary
this covers the common COCO nouns and adjectives, not every noun a tagger finds. Both
split trigrams on their own tokens (the original uses nltk's `word_tokenize` there), and
the shuffles draw from a seeded numpy generator rather than the original's global
`random` / `np.random` state, so single perturbations differ from a run of the original
while following the same rules.
"""

from __future__ import annotations

import re

import numpy as np

from lace.errors import LaceInputError

TOKEN = re.compile(r"[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*|[^\w\s]")
PERTURBATIONS = ("shuffle_nouns_and_adjectives", "shuffle_all_but_nouns_and_adjectives",
                 "shuffle_within_trigrams", "shuffle_trigrams")


def pre_caption(caption: str, max_words: int = 30) -> str:
    """BLIP's caption cleaning, as ARO applies it to every option."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


class VocabularyTagger:
    """Tags tokens as "noun" (object words), "adj" (attribute words) or "other"."""

    def __init__(self, rule_negatives):
        self._matcher = rule_negatives

    def tag(self, caption: str) -> tuple[list[str], list[str]]:
        """Tokens of `caption` (words and punctuation) and their tags."""
        spans = [(m.start, m.end, "noun" if m.kind == "object" else "adj")
                 for m in self._matcher.mentions(caption) if m.kind in ("object", "attribute")]
        tokens, tags = [], []
        for match in TOKEN.finditer(caption):
            tokens.append(match.group(0))
            tag = next((t for start, end, t in spans if start <= match.start() and match.end() <= end), "other")
            tags.append(tag)
        return tokens, tags


NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")  # as perturbations.py of the original
ADJECTIVE_TAGS = ("JJ", "JJR", "JJS")


class SpacyTagger:
    """Tags tokens from spaCy's part-of-speech tags, as ARO's `perturbations.py` does."""

    def __init__(self, model: str = "en_core_web_sm"):
        try:
            import spacy

            self._nlp = spacy.load(model)
        except (ImportError, OSError) as error:
            raise LaceInputError(
                f"the spaCy tagger needs spaCy and its {model!r} model (pip install spacy && "
                f"python -m spacy download {model}); or use the vocabulary tagger ({error})"
            ) from error

    def tag(self, caption: str) -> tuple[list[str], list[str]]:
        """Tokens of `caption` as spaCy splits them and their tags ("noun", "adj", "other")."""
        doc = self._nlp(caption)
        tags = ["noun" if token.tag_ in NOUN_TAGS else "adj" if token.tag_ in ADJECTIVE_TAGS else "other"
                for token in doc]
        return [token.text for token in doc], tags


def _shuffle_positions(tokens: list[str], positions: list[int], rng: np.random.Generator) -> None:
    values = [tokens[i] for i in positions]
    for i, j in zip(positions, rng.permutation(len(values))):
        tokens[i] = values[j]


def _trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i: i + 3] for i in range(0, len(tokens), 3)]


def order_perturbations(caption: str, tagger: VocabularyTagger | SpacyTagger, rng: np.random.Generator) -> list[str]:
    """The four perturbed captions of `caption` (before `pre_caption`), in `PERTURBATIONS` order."""
    tokens, tags = tagger.tag(caption)
    nouns_adjectives = list(tokens)
    _shuffle_positions(nouns_adjectives, [i for i, t in enumerate(tags) if t == "noun"], rng)
    _shuffle_positions(nouns_adjectives, [i for i, t in enumerate(tags) if t == "adj"], rng)
    others = list(tokens)
    _shuffle_positions(others, [i for i, t in enumerate(tags) if t == "other"], rng)
    within = [[trigram[j] for j in rng.permutation(len(trigram))] for trigram in _trigrams(tokens)]
    trigrams = _trigrams(tokens)
    across = [trigrams[j] for j in rng.permutation(len(trigrams))]
    return [
        " ".join(nouns_adjectives),
        " ".join(others),
        " ".join(word for trigram in within for word in trigram),
        " ".join(word for trigram in across for word in trigram),
    ]

"""Swap items written independently of the rule editor: whole phrases exchanged between two noun phrases.

The rule editor (`lace.edits.captions`) writes the captions of the edits in training and the
`sugarcrepe_style/*` items, by exchanging single words its typed vocabulary knows. A gain on its items may
come from learning its habits. This writer shares neither its code nor its vocabulary: it parses a caption
with its own small lexicon into noun phrases (people and animals with their modifiers and clothing phrases;
animals, garments and things with a colour phrase; things a subject stands in front of or behind) and exchanges
whole phrases:

- swap_att: the clothing phrases of two people or two animals ("a man in a white shirt sits near a woman in
  black" -> "a man in black sits near a woman in a white shirt"); the colour phrases of two things, garments or
  animals, or a colour a person wears alone ("a man in a blue and white shirt rides a red bike" -> "a man in a
  red shirt rides a blue and white bike"); the modifier phrases of two animals ("a large brown dog chases a
  small white dog" -> "a small white dog chases a large brown dog"); a small and a big (or a young and an old)
  word of two people or animals ("a little girl hugs a big dog" -> "a big girl hugs a little dog");
- swap_obj: two whole noun phrases around a relation whose two directions differ and are both plausible
  ("a man in a red shirt chases a dog" -> "a dog chases a man in a red shirt"; "a man stands in front of a
  brick wall" -> "a brick wall stands in front of a man"), or the subjects of two clauses ("a man in red sits
  while a woman stands" -> "a woman sits while a man in red stands"); a verb agrees with its new subject.

It refuses whatever it cannot parse wholly with its lexicon, pairs whose exchange leaves the meaning
unchanged (two of one kind across "and", "a boy" and "a child", the same colours), exchanges that a text alone
would reject ("a blue dog", "a child carries a woman", "a bird carries a dog"), phrases that go on past what
it parsed (a list of colours, "a hat that looks like ...", a coordinated object), words that would then refer
to the wrong one ("another", a gendered pronoun) and a dress, skirt, bikini or gown moved onto a man or boy.
Precision over recall.

    negative = phrase_swap("A black dog chases a white cat .", "swap_obj", random.Random(0))
    items = phrase_swap_items(captions, caption_image_index, per_kind=1000)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lace.study.phrase_lexicon import (
    AGES,
    ANIMAL_COLOURS,
    ANIMALS,
    ATTACHING,
    ATTIRE_OPENERS,
    CARRYING,
    CHILDREN,
    CLAUSE_JOINS,
    CLAUSE_VERBS,
    COLOURS,
    DIRECTED_RELATIONS,
    ENTITY_ADJECTIVES,
    ENTITY_DETERMINERS,
    FEMALE,
    GARMENT_DETERMINERS,
    GARMENT_MODIFIERS,
    GARMENTS,
    GENDERED_PRONOUNS,
    HEAD_CLASSES,
    ING_NOUNS,
    LEFT_BOUNDARIES,
    MALE,
    MATERIALS,
    NOT_AGENTS,
    OBJECT_RELATIONS,
    OTHER_NUMBER,
    PEOPLE,
    PERSON_CLASSES,
    PLACE_THINGS,
    PLACES,
    POSSESSIVES,
    REFERRING,
    RELATIVES,
    RIGHT_BOUNDARIES,
    SAME_KIND_RELATIONS,
    SHADES,
    SHARED_VERBS,
    SIZES,
    STILL_VERBS,
    SYMMETRIC_RELATIONS,
    THINGS,
    WOMENS_GARMENTS,
)

KINDS = ("swap_att", "swap_obj")
VERSION = 4
"""Changes whenever a rewrite rule or the lexicon (`lace.study.phrase_lexicon`) changes (the studies key their
measurements on it)."""

# --- parsing ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NounPhrase:
    """A parsed noun phrase over token positions [start, end): determiner at `start`, modifiers
    [start + 1, head), the head, and the clothing phrase [head + 1, end) (empty when there is none)."""

    start: int
    head: int
    end: int
    kind: str  # "person" or "animal"
    number: str  # "singular" or "plural"

    @property
    def has_attire(self) -> bool:
        return self.end > self.head + 1


def _is_word_of(token: str, words: frozenset) -> bool:
    return token in words or ("-" in token and all(part in words or part == "and" for part in token.split("-")))


def _modifiers(tokens: Sequence[str], i: int, words: frozenset) -> int:
    """The end of the modifiers starting at `i` ("black and white" joins colours only)."""
    while i < len(tokens):
        joins_colours = (tokens[i] == "and" and i > 0 and tokens[i - 1] in COLOURS and i + 1 < len(tokens)
                         and tokens[i + 1] in COLOURS)
        if _is_word_of(tokens[i], words) or joins_colours:
            i += 1
        else:
            break
    return i


def _garment(tokens: Sequence[str], i: int) -> int | None:
    """The end of one garment phrase ("a red shirt", "blue jeans") starting at `i`, or None."""
    if i < len(tokens) and tokens[i] in GARMENT_DETERMINERS:
        i += 1
    head = _modifiers(tokens, i, GARMENT_MODIFIERS)
    return head + 1 if head < len(tokens) and tokens[head] in GARMENTS else None


def _attire(tokens: Sequence[str], i: int) -> int:
    """The end of the clothing phrase at `i` ("in a red shirt and blue jeans", "wearing a hat", "in blue"), or `i`
    when there is none."""
    for opener in ATTIRE_OPENERS:
        if tuple(tokens[i:i + len(opener)]) != opener:
            continue
        end = _garment(tokens, i + len(opener))
        while end is not None and end < len(tokens) and tokens[end] == "and":
            more = _garment(tokens, end + 1)
            if more is None:
                break
            end = more
        if end is None:  # a colour alone ("the boy in blue", "wearing black and white") is clothing too
            colours_end = _modifiers(tokens, i + len(opener), COLOURS | SHADES)
            end = colours_end if colours_end > i + len(opener) and _ends_clause(tokens, colours_end) else None
        if end is not None and not _continues(tokens, end):
            return end
    return i


def _continues(tokens: Sequence[str], end: int) -> bool:
    """Whether a clothing phrase goes on past `end` ("a shawl over her head", "in pink , striped clothing", "a hat
    that looks like a dog")."""
    if end < len(tokens) and tokens[end] in RELATIVES:
        return True
    if end + 1 >= len(tokens) or tokens[end] not in RIGHT_BOUNDARIES:
        return False
    return bool(set(tokens[end + 1:end + 3]) & POSSESSIVES) or (
        tokens[end] == "," and (tokens[end + 1] in GARMENT_MODIFIERS or tokens[end + 1] in GARMENTS))


def _noun_phrase(tokens: Sequence[str], start: int) -> NounPhrase | None:
    """The person or animal noun phrase that starts at `start`, or None."""
    if start >= len(tokens) or tokens[start] not in ENTITY_DETERMINERS:
        return None
    head = _modifiers(tokens, start + 1, ENTITY_ADJECTIVES)
    if head >= len(tokens):
        return None
    word = tokens[head]
    lexicon = PEOPLE if word in PEOPLE else ANIMALS if word in ANIMALS else None
    if lexicon is None:
        return None
    number = lexicon[word]
    if (tokens[start] in ("a", "an", "another", "one") and number == "plural") or (
            tokens[start] not in ("a", "an", "another", "one", "the") and number == "singular"):
        return None
    return NounPhrase(start, head, _attire(tokens, head + 1), "person" if lexicon is PEOPLE else "animal", number)


def noun_phrases(tokens: Sequence[str]) -> list[NounPhrase]:
    """Every person or animal noun phrase of `tokens`, left to right."""
    return [phrase for phrase in (_noun_phrase(tokens, i) for i in range(len(tokens))) if phrase is not None]


def _ends_cleanly(tokens: Sequence[str], end: int) -> bool:
    """Whether the second noun phrase really ends at `end` (no compound noun, possessive or clothing after it)."""
    if end == len(tokens):
        return True
    following = tokens[end]
    if following in ATTACHING:
        return False
    if following == "in" and any(t in COLOURS or t in GARMENTS for t in tokens[end + 1:end + 4]):
        return False
    return _ends_clause(tokens, end)


def _ends_clause(tokens: Sequence[str], end: int) -> bool:
    """Whether the word at `end` (if any) cannot continue a noun phrase: a preposition, a verb, punctuation."""
    if end == len(tokens):
        return True
    following = tokens[end]
    return (following in RIGHT_BOUNDARIES or following in CLAUSE_VERBS
            or (following.endswith("ing") and following not in ING_NOUNS))


def related_pairs(tokens: Sequence[str]) -> list[tuple[NounPhrase, NounPhrase, tuple[str, ...]]]:
    """Every (first, second, relation) of two noun phrases that the relation joins directly, the second ending
    cleanly (`starts_clause` tells whether the first also starts the caption or a clause)."""
    pairs = _joined(tokens, noun_phrases(tokens), DIRECTED_RELATIONS | SYMMETRIC_RELATIONS, _noun_phrase)
    return sorted(pairs, key=lambda pair: (pair[0].start, pair[1].start, pair[2]))


def _joined(tokens: Sequence[str], firsts: Sequence[NounPhrase], relations, second_phrase: Callable) -> list[tuple]:
    """Every (first, second, relation): a phrase of `firsts`, one of `relations` right after it, then the phrase
    `second_phrase(tokens, position)` reads right after that, ending cleanly; in the order of `firsts`."""
    pairs = []
    for first in firsts:
        for relation in relations:
            if tuple(tokens[first.end:first.end + len(relation)]) == relation:
                second = second_phrase(tokens, first.end + len(relation))
                if second is not None and _ends_cleanly(tokens, second.end):
                    pairs.append((first, second, relation))
    return pairs


def _thing_phrase(tokens: Sequence[str], start: int) -> NounPhrase | None:
    """A thing's noun phrase that starts at `start` ("a large brick building"), kind "thing", or None."""
    if start >= len(tokens) or tokens[start] not in ("a", "an", "the", "two", "some", "several"):
        return None
    head = _modifiers(tokens, start + 1, ENTITY_ADJECTIVES | GARMENT_MODIFIERS | MATERIALS)
    if head >= len(tokens) or tokens[head] not in PLACE_THINGS:
        return None
    number = PLACE_THINGS[tokens[head]]
    if (tokens[start] in ("a", "an")) != (number == "singular") and tokens[start] != "the":
        return None
    return NounPhrase(start, head, head + 1, "thing", number)


def place_pairs(tokens: Sequence[str]) -> list[tuple[NounPhrase, NounPhrase, tuple[str, ...]]]:
    """Every (subject, thing, relation) of a person or an animal that starts a clause, a verb of standing still
    (or none), `PLACES` and a thing's noun phrase that ends cleanly ("a man is standing behind a red car")."""
    subjects = [phrase for phrase in noun_phrases(tokens) if starts_clause(tokens, phrase)]
    return _joined(tokens, subjects, [still + place for still in STILL_VERBS for place in PLACES], _thing_phrase)


def starts_clause(tokens: Sequence[str], phrase: NounPhrase) -> bool:
    """Whether `phrase` is a subject that can trade places: it starts the caption or a clause (not "the owner
    of a dog")."""
    return phrase.start == 0 or tokens[phrase.start - 1] in LEFT_BOUNDARIES


def _is_verb(token: str) -> bool:
    """Whether `token` goes on a clause after its subject ("walks", "is", "running")."""
    return (token in CLAUSE_VERBS or token in OTHER_NUMBER
            or (token.endswith("ing") and token not in ING_NOUNS and token not in ATTACHING))


def clause_pairs(tokens: Sequence[str]) -> list[tuple[NounPhrase, NounPhrase]]:
    """Every (first, second) of two subjects of two clauses ("a man in red sits while a woman stands"): the first
    starts the caption or a clause, each is followed by its verb, and the second follows a word of
    `CLAUSE_JOINS` after the first clause has said something."""
    subjects = [phrase for phrase in noun_phrases(tokens) if phrase.end < len(tokens) and _is_verb(tokens[phrase.end])]
    return [(first, second) for first in subjects if starts_clause(tokens, first)
            for second in subjects if second.start - 1 > first.end and tokens[second.start - 1] in CLAUSE_JOINS]


@dataclass(frozen=True)
class ColouredPhrase:
    """A head noun (an animal, a garment or a thing) whose modifiers [start, head) hold one colour phrase
    [colour_start, colour_end) ("a small black and white dog": "black and white")."""

    start: int
    colour_start: int
    colour_end: int
    head: int

    def colours(self, tokens: Sequence[str]) -> frozenset[str]:
        return frozenset(part for token in tokens[self.colour_start:self.colour_end] for part in token.split("-")
                         if part in COLOURS)


def _is_colour(tokens: Sequence[str], i: int) -> bool:
    """Whether the word at `i` belongs to a colour phrase ("dark", "blue-green", the "and" of "black and white")."""
    if tokens[i] == "and":
        return 0 < i < len(tokens) - 1 and tokens[i - 1] in COLOURS and tokens[i + 1] in COLOURS
    return _is_word_of(tokens[i], COLOURS | SHADES)


def _coloured_phrase(tokens: Sequence[str], head: int) -> ColouredPhrase | None:
    """The colour phrase of the head noun at `head`, or None (no colour, two colour phrases, or the noun is the
    first half of a compound: the colour of "a black dog collar" is the collar's)."""
    if not (tokens[head] in ANIMALS or tokens[head] in THINGS or tokens[head] in GARMENTS):
        return None
    if head + 1 < len(tokens) and any(tokens[head + 1] in nouns for nouns in (PEOPLE, ANIMALS, THINGS, GARMENTS)):
        return None
    start = head
    while start > 0 and (_is_colour(tokens, start - 1) or _is_word_of(tokens[start - 1], ENTITY_ADJECTIVES
                                                                          | GARMENT_MODIFIERS)):
        start -= 1
    if start >= 2 and tokens[start - 1] == "," and _is_word_of(tokens[start - 2], COLOURS):
        return None  # one end of a list of colours ("red , white and blue")
    runs, i = [], start
    while i < head:
        if _is_colour(tokens, i):
            end = next((j for j in range(i, head) if not _is_colour(tokens, j)), head)
            runs.append((i, end))
            i = end
        i += 1
    found = [ColouredPhrase(start, a, b, head) for a, b in runs]
    return found[0] if len(found) == 1 and found[0].colours(tokens) else None


def coloured_phrases(tokens: Sequence[str]) -> list[ColouredPhrase]:
    """Every colour phrase of `tokens` bound to an animal, a garment or a thing, or worn alone by a person ("a boy
    in black and white": its head is the wearer's), left to right."""
    found = [phrase for phrase in (_coloured_phrase(tokens, i) for i in range(len(tokens))) if phrase is not None]
    for wearer in noun_phrases(tokens):
        if wearer.kind != "person" or not wearer.has_attire:
            continue
        opener = next(o for o in ATTIRE_OPENERS if tuple(tokens[wearer.head + 1:wearer.head + 1 + len(o)]) == o)
        colour_start = wearer.head + 1 + len(opener)
        if all(_is_colour(tokens, i) for i in range(colour_start, wearer.end)):
            found.append(ColouredPhrase(colour_start, colour_start, wearer.end, wearer.head))
    return sorted(found, key=lambda phrase: phrase.colour_start)


# --- rewrites -----------------------------------------------------------------------------------------------

def _exchange(tokens: list[str], first: tuple[int, int], second: tuple[int, int]) -> list[str]:
    """`tokens` with the spans `first` and `second` (first before second, not overlapping) exchanged."""
    (a, b), (c, d) = first, second
    return tokens[:a] + tokens[c:d] + tokens[b:c] + tokens[a:b] + tokens[d:]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" and not word.startswith(("uni", "use", "one", "eu")) else "a"


def _attire_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, symmetric: bool) -> list[list[str]]:
    """The clothing phrases of two people (or two animals) exchanged whole ("a man in a hat talks to a woman in a
    black dress" -> "a man in a black dress ..." is refused, "a boy in a hat ... a girl in a black coat" is not)."""
    if not (first.has_attire and second.has_attire) or first.kind != second.kind:
        return []
    worn_first, worn_second = _worn(tokens[first.head + 1:first.end]), _worn(tokens[second.head + 1:second.end])
    # each must wear a colour or a garment the other does not ("in red winter clothes" / "in red" bind nothing)
    if not (worn_first - worn_second and worn_second - worn_first) or (
            symmetric and _could_be_one(tokens[first.head], tokens[second.head])):
        return []
    for wearer, worn in ((first, worn_second), (second, worn_first)):
        if tokens[wearer.head] in MALE and WOMENS_GARMENTS & worn:
            return []
    return [_exchange(tokens, (first.head + 1, first.end), (second.head + 1, second.end))]


def _worn(words: Sequence[str]) -> frozenset[str]:
    """The colours and the garments (singular) a clothing phrase names."""
    return frozenset(part for word in words for part in word.split("-") if part in COLOURS) | frozenset(
        _head_class(word) for word in words if word in GARMENTS)


def _colour_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, symmetric: bool) -> list[list[str]]:
    if first.kind != "animal" or second.kind != "animal":
        return []
    colour_first, colour_second = tokens[first.start + 1:first.head], tokens[second.start + 1:second.head]
    if not (COLOURS & set(colour_first) and COLOURS & set(colour_second)) or colour_first == colour_second:
        return []
    if symmetric and _could_be_one(tokens[first.head], tokens[second.head]):
        return []
    swapped = _exchange(tokens, (first.start + 1, first.head), (second.start + 1, second.head))
    _fix_articles(swapped, (first.start, second.start + len(colour_second) - len(colour_first)))
    return [swapped]


def _fix_articles(tokens: list[str], positions: Sequence[int]) -> None:
    """"a" or "an" at `positions` made to agree with the word after it (in place)."""
    for position in positions:
        if 0 <= position < len(tokens) - 1 and tokens[position] in ("a", "an"):
            tokens[position] = _article(tokens[position + 1])


def _colour_phrase_swaps(tokens: list[str], distinguished: set[tuple[int, int]]) -> list[list[str]]:
    """The colour phrases of two different things exchanged whole ("a man in a black and white shirt rides a red
    bike" -> "a man in a red shirt rides a black and white bike"). Two of the same kind (two dogs) only where the
    caption tells them apart: `distinguished` holds their heads' positions (a directed relation or two clauses)."""
    rewrites = []
    phrases = coloured_phrases(tokens)
    for n, first in enumerate(phrases):
        for second in phrases[n + 1:]:
            if _colour_swap_refused(tokens, first, second, distinguished):
                continue
            swapped = _exchange(tokens, (first.colour_start, first.colour_end),
                                (second.colour_start, second.colour_end))
            shift = (second.colour_end - second.colour_start) - (first.colour_end - first.colour_start)
            _fix_articles(swapped, (first.colour_start - 1, second.colour_start - 1 + shift))
            rewrites.append(swapped)
    return rewrites


def _colour_swap_refused(tokens: Sequence[str], first: ColouredPhrase, second: ColouredPhrase,
                         distinguished: set[tuple[int, int]]) -> bool:
    own_first, own_second = first.colours(tokens), second.colours(tokens)
    if not (own_first - own_second and own_second - own_first):
        return True  # each must bring a colour the other lacks, or the exchange may still be true
    for phrase, arriving in ((first, own_second), (second, own_first)):
        if tokens[phrase.head] in ANIMALS and not arriving <= ANIMAL_COLOURS:
            return True  # "a blue dog": implausible, a text alone would reject it
    if _head_class(tokens[first.head]) == _head_class(tokens[second.head]):
        return (first.head, second.head) not in distinguished
    return False


def _head_class(word: str) -> str:
    """What a reader takes `word` for: "puppies" -> "dog", "shirts" -> "shirt", any animal word -> itself."""
    if word in HEAD_CLASSES:
        return HEAD_CLASSES[word]
    for ending in ("es", "s"):
        if word.endswith(ending) and word[:-len(ending)] in GARMENTS:
            return word[:-len(ending)]
    return word


def _could_be_one(first: str, second: str) -> bool:
    """Whether two person or animal words may name the same one ("a boy" and "a child", "a dog" and "an
    animal"): exchanging them changes nothing a picture shows."""
    if (first in PEOPLE) != (second in PEOPLE) or (first in ANIMALS) != (second in ANIMALS):
        return False  # a person, an animal and a thing are never one
    classes = {PERSON_CLASSES.get(first, _head_class(first)), PERSON_CLASSES.get(second, _head_class(second))}
    return len(classes) == 1 or bool(classes & {"person", "animal"}) or classes in ({"child", "boy"},
                                                                                      {"child", "girl"})


def _subjects_refused(tokens: Sequence[str], first: NounPhrase, second: NounPhrase) -> bool:
    """Whether two noun phrases may not trade places as wholes: they may name one kind of thing, one cannot act
    (a baby), something refers back ("another"), or a pronoun outside them would then disagree with its noun."""
    words = (tokens[first.head], tokens[second.head])
    genders = {("male" if word in MALE else "female" if word in FEMALE else "") for word in words}
    outside = set(tokens[:first.start] + tokens[first.end:second.start] + tokens[second.end:])
    return (_could_be_one(*words) or bool(set(words) & NOT_AGENTS) or bool(REFERRING & {
            tokens[first.start], tokens[second.start]} | REFERRING & outside) or (
            len(genders) == 2 and bool(GENDERED_PRONOUNS & outside)))


def _object_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, relation) -> list[list[str]]:
    """The two noun phrases around a relation exchanged whole ("a man in red chases a dog" -> "a dog chases a man
    in red"), the verb made to agree with its new subject."""
    reversible = (relation in OBJECT_RELATIONS or (first.kind == second.kind and relation in SAME_KIND_RELATIONS)
                  or second.kind == "thing")
    if not starts_clause(tokens, first) or not reversible or _subjects_refused(tokens, first, second):
        return []
    if CARRYING & set(relation) and ({tokens[first.head], tokens[second.head]} & CHILDREN or "animal" in (
            first.kind, second.kind)):
        return []  # "a child holds two women", "a bird carries a dog"
    if tokens[second.end:second.end + 1] == ["and"]:
        return []  # the second is one of two ("in front of a brick wall and a sign")
    swapped = _exchange(tokens, (first.start, first.end), (second.start, second.end))
    if first.number != second.number:
        if any(token in OTHER_NUMBER or token in CLAUSE_VERBS for token in tokens[second.end:]):
            return []  # a later verb of the subject would disagree
        verb = first.start + second.end - second.start  # the relation's first word, after the exchange
        swapped[verb] = OTHER_NUMBER.get(swapped[verb], swapped[verb])
    return [swapped]


def _clause_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase) -> list[list[str]]:
    """The subjects of two clauses exchanged whole ("a man in red sits while a woman stands" -> "a woman sits
    while a man in red stands"), of one number; a person and an animal only where both do what either can."""
    if first.number != second.number or _subjects_refused(tokens, first, second):
        return []
    if first.kind != second.kind and not all(_clause_verb(tokens, phrase) in SHARED_VERBS
                                             and not _does_more(tokens, phrase) for phrase in (first, second)):
        return []
    return [_exchange(tokens, (first.start, first.end), (second.start, second.end))]


def _clause_verb(tokens: Sequence[str], subject: NounPhrase) -> str:
    """The verb after `subject`, past "is" or "are"."""
    verb = subject.end + (tokens[subject.end] in ("is", "are"))
    return tokens[verb] if verb < len(tokens) else ""


def _does_more(tokens: Sequence[str], subject: NounPhrase) -> bool:
    """Whether the clause of `subject` goes on with a second verb after its first ("runs along clapping")."""
    verb = subject.end + (tokens[subject.end] in ("is", "are"))
    rest = []
    for token in tokens[verb + 1:]:
        if token in CLAUSE_JOINS or token == ".":
            break
        rest.append(token)
    return any(_is_verb(token) for token in rest)


def _size_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase) -> list[list[str]]:
    """A small word and a big word (or a young and an old one) of two people or animals exchanged ("a little girl
    hugs a big dog" -> "a big girl hugs a little dog")."""
    rewrites = []
    for sides in (SIZES, AGES):
        words = sides[0] | sides[1]
        found = [[i for i in range(phrase.start + 1, phrase.head) if tokens[i] in words] for phrase in (first, second)]
        if not all(len(positions) == 1 for positions in found):
            continue
        (i,), (j,) = found
        if any({tokens[i], tokens[j]} <= side for side in sides):
            continue
        swapped = list(tokens)
        swapped[i], swapped[j] = tokens[j], tokens[i]
        _fix_articles(swapped, (i - 1, j - 1))
        rewrites.append(swapped)
    return rewrites


def _attribute_pairs(tokens: Sequence[str], pairs: list, clauses: list) -> list[tuple[NounPhrase, NounPhrase, bool]]:
    """(first, second, told apart) for every two people or animals whose attributes may be exchanged: those a
    relation joins (told apart unless it reads the same both ways), the subjects of two clauses (told apart), and
    any other two that cannot name the same kind of one ("a man in red ... near a woman in blue")."""
    found = [(first, second, relation not in SYMMETRIC_RELATIONS) for first, second, relation in pairs]
    found += [(first, second, True) for first, second in clauses]
    seen = {(first.start, second.start) for first, second, _ in found}
    phrases = noun_phrases(tokens)
    found += [(first, second, True) for first in phrases for second in phrases
              if second.start >= first.end and (first.start, second.start) not in seen
              and not _could_be_one(tokens[first.head], tokens[second.head])]
    return found


def phrase_swaps(caption: str, kind: str) -> list[str]:
    """Every rewrite of `kind` ("swap_att" or "swap_obj") of `caption`, in a fixed order (may be empty)."""
    if kind not in KINDS:
        raise ValueError(f"phrase swap kind: expected one of {KINDS}, got {kind!r}")
    words = caption.split()
    if not words:
        return []
    capital = words[0][:1].isupper()
    tokens = [words[0][:1].lower() + words[0][1:]] + words[1:]
    pairs, clauses = related_pairs(tokens), clause_pairs(tokens)
    rewrites = []
    if kind == "swap_obj":
        for first, second, relation in pairs + place_pairs(tokens):
            rewrites += _object_swaps(tokens, first, second, relation)
        for first, second in clauses:
            rewrites += _clause_swaps(tokens, first, second)
    else:
        told_apart = _attribute_pairs(tokens, pairs, clauses)
        for first, second, apart in told_apart:
            rewrites += _attire_swaps(tokens, first, second, not apart)
            rewrites += _colour_swaps(tokens, first, second, not apart)
            rewrites += _size_swaps(tokens, first, second) if apart or first.kind != second.kind else []
        rewrites += _colour_phrase_swaps(tokens, {(first.head, second.head) for first, second, apart in told_apart
                                                  if apart})
    texts = []
    for rewrite in rewrites:
        if capital:
            rewrite[0] = rewrite[0][:1].upper() + rewrite[0][1:]
        text = " ".join(rewrite)
        if text != " ".join(words) and text not in texts:
            texts.append(text)
    return texts


def phrase_swap(caption: str, kind: str, rng: random.Random) -> str | None:
    """One rewrite of `kind` of `caption` drawn by `rng`, or None when the writer refuses the caption."""
    rewrites = phrase_swaps(caption, kind)
    return rng.choice(rewrites) if rewrites else None


def phrase_swap_items(captions: Sequence[str], caption_image_index: np.ndarray, per_kind: int, seed: int = 0,
                      exclude: Callable[[str, str], bool] | None = None) -> list[dict]:
    """Items per kind of `KINDS` (`draw_items`, as `lace.study.measure.sugarcrepe_style_items` draws the rule
    editor's): one rewrite per caption (rewrites for which `exclude(caption, rewrite)` holds are not drawn)."""

    def draw(kind: str, caption: str, rng: random.Random) -> str | None:
        rewrites = [text for text in phrase_swaps(caption, kind) if exclude is None or not exclude(caption, text)]
        return rng.choice(rewrites) if rewrites else None

    return draw_items(KINDS, captions, caption_image_index, per_kind, f"phrase-{seed}", draw)


def draw_items(kinds: Iterable[str], captions: Sequence[str], caption_image_index: np.ndarray, per_kind: int,
               seed: str, draw: Callable[[str, str, random.Random], str | None]) -> list[dict]:
    """Items `{"kind", "image", "caption", "caption_row", "negative_caption"}` per kind: `draw(kind, caption, rng)`'s
    negative of each caption (None: no item; rng seeded by `seed`, kind and row), at most `per_kind` per kind (a
    seeded sample, kept in caption order)."""
    items = []
    for kind in kinds:
        found = []
        for row, caption in enumerate(captions):
            negative = draw(kind, caption, random.Random(f"{seed}-{kind}-{row}"))
            if negative is not None:
                found.append({"kind": kind, "image": int(caption_image_index[row]), "caption": caption,
                              "caption_row": row, "negative_caption": negative})
        if len(found) > per_kind:
            keep = sorted(random.Random(f"{seed}-{kind}").sample(range(len(found)), per_kind))
            found = [found[i] for i in keep]
        items.extend(found)
    return items


__all__ = ["KINDS", "VERSION", "ColouredPhrase", "NounPhrase", "clause_pairs", "coloured_phrases", "draw_items",
           "noun_phrases", "phrase_swap", "phrase_swap_items", "phrase_swaps", "place_pairs", "related_pairs"]

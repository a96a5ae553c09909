"""Swap items written independently of the rule editor: whole phrases exchanged between two noun phrases.

The rule editor (`lace.edits.captions`) writes the captions of the edits in training and the
`sugarcrepe_style/*` items, by exchanging single words its typed vocabulary knows. A gain on its items may
come from learning its habits. This writer shares neither its code nor its vocabulary: it parses a caption
with its own small lexicon into noun phrases (determiner, modifiers, head, a clothing phrase) joined by a
known relation, and exchanges whole phrases:

- swap_att: the clothing phrases of two people or two animals ("a man in a red shirt and a woman in a
  blue dress" -> "a man in a blue dress and a woman in a red shirt"), or the colour phrases in front of two
  animals ("a black and white dog chases a brown dog" -> "a brown dog chases a black and white dog");
- swap_obj: two whole noun phrases around a relation whose two directions differ and are both plausible
  ("a man in a red shirt chases a dog" -> "a dog chases a man in a red shirt").

It refuses whatever it cannot parse wholly with its lexicon, pairs whose exchange leaves the meaning
unchanged (two like phrases, "and" between two of the same kind), plural against singular (the verb would
disagree), and a dress, skirt, bikini or gown moved onto a man or boy. Precision over recall.

    negative = phrase_swap("A black dog chases a white cat .", "swap_obj", random.Random(0))
    items = phrase_swap_items(captions, caption_image_index, per_kind=1000)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

KINDS = ("swap_att", "swap_obj")
VERSION = 3
"""Changes whenever a rewrite rule or the lexicon changes (the studies key their measurements on it)."""

# --- lexicon ------------------------------------------------------------------------------------------------

def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


COLOURS = _set(
    "red blue green yellow black white brown pink orange purple gray grey tan gold golden silver beige maroon "
    "teal navy turquoise")
SHADES = _set("dark light bright pale")
ENTITY_ADJECTIVES = COLOURS | SHADES | _set(
    "young little small smaller large larger big bigger old older elderly tall wet muddy fluffy shaggy furry spotted curly blond blonde "
    "brunette shirtless smiling")
GARMENT_MODIFIERS = COLOURS | SHADES | _set(
    "striped plaid checkered polka dot dotted floral long short sleeved long-sleeved short-sleeved sleeveless tank "
    "bathing life baseball cowboy winter knit hooded button-up denim leather jean tie-dye printed patterned "
    "matching wool")


def _forms(pairs: str) -> dict[str, str]:
    """'man/men woman/women' -> {'man': 'singular', 'men': 'plural', ...}."""
    number = {}
    for pair in pairs.split():
        singular, plural = pair.split("/")
        number[singular], number[plural] = "singular", "plural"
    return number


PEOPLE = _forms("man/men woman/women boy/boys girl/girls child/children kid/kids person/people lady/ladies guy/guys "
                "toddler/toddlers teenager/teenagers baby/babies")
ANIMALS = _forms("dog/dogs puppy/puppies cat/cats horse/horses cow/cows bird/birds duck/ducks goat/goats pony/ponies "
                 "bull/bulls animal/animals")
GARMENTS = _set(
    "shirt shirts t-shirt t-shirts tshirt dress dresses jacket jackets coat coats hat hats cap caps helmet helmets "
    "top tops sweater sweaters sweatshirt sweatshirts hoodie hoodies pants shorts jeans skirt skirts uniform "
    "uniforms suit suits swimsuit swimsuits bikini bikinis outfit outfits costume costumes vest vests scarf gloves "
    "boots shoes sneakers socks bandana headband goggles wetsuit wetsuits trunks jersey jerseys gown apron "
    "overalls leggings tights beanie hood collar harness sunglasses clothes clothing")
WOMENS_GARMENTS = _set("dress dresses skirt skirts bikini bikinis gown")
NOT_AGENTS = frozenset({"baby", "babies"})  # "a baby pushes a man": not a plausible exchange
MEN = _set("man men boy boys guy guys")
ENTITY_DETERMINERS = _set("a an another the one two three four several some")
GARMENT_DETERMINERS = _set("a an the")
ATTIRE_OPENERS = (("dressed", "in"), ("in",), ("wearing",), ("with",))


def _verb_connectors(verbs: str) -> frozenset[tuple[str, ...]]:
    """'chase/chases/chasing run/runs/running+after' -> every form: (chases,), (chase,), (is, chasing), ..."""
    found = set()
    for entry in verbs.split():
        forms, _, particle = entry.partition("+")
        plain, third, ing = forms.split("/")
        tail = tuple(particle.split("_")) if particle else ()
        for head in ((plain,), (third,), (ing,), ("is", ing), ("are", ing)):
            found.add(head + tail)
    return frozenset(found)


# Relations whose two directions are both plausible and look different: exchanged objects keep a sentence.
OBJECT_RELATIONS = _verb_connectors(
    "chase/chases/chasing follow/follows/following watch/watches/watching push/pushes/pushing pull/pulls/pulling "
    "lead/leads/leading tackle/tackles/tackling look/looks/looking+at stare/stares/staring+at "
    "jump/jumps/jumping+over run/runs/running+after run/runs/running+behind walk/walks/walking+behind "
    "stand/stands/standing+behind sit/sits/sitting+behind stand/stands/standing+in_front_of "
    "sit/sits/sitting+in_front_of run/runs/running+from run/runs/running+toward run/runs/running+towards "
    "walk/walks/walking+toward walk/walks/walking+towards spray/sprays/spraying splash/splashes/splashing") | {
    ("behind",), ("in", "front", "of")} | {
    prefix + (done, "by") for prefix in ((), ("is",), ("are",), ("is", "being"), ("are", "being"), ("being",))
    for done in ("chased", "followed", "pushed", "pulled", "watched", "led", "tackled")}
# Directed relations an attribute exchange may cross (their subject and object stay where they are).
DIRECTED_RELATIONS = OBJECT_RELATIONS | _verb_connectors(
    "hold/holds/holding carry/carries/carrying hug/hugs/hugging feed/feeds/feeding help/helps/helping "
    "lift/lifts/lifting bite/bites/biting lick/licks/licking sniff/sniffs/sniffing nuzzle/nuzzles/nuzzling "
    "jump/jumps/jumping+on jump/jumps/jumping+up_at kiss/kisses/kissing take/takes/taking+a_picture_of "
    "photograph/photographs/photographing")
# Relations that read the same both ways: an exchange across them must change which one is which.
SYMMETRIC_RELATIONS = frozenset({("and",), ("with",), ("beside",), ("next", "to")}) | _verb_connectors(
    "stand/stands/standing+next_to sit/sits/sitting+next_to play/plays/playing+with walk/walks/walking+with "
    "talk/talks/talking+to talk/talks/talking+with wrestle/wrestles/wrestling+with fight/fights/fighting+with "
    "fight/fights/fighting stand/stands/standing+with sit/sits/sitting+with pose/poses/posing+with "
    "dance/dances/dancing+with") | {("is", "next", "to"), ("are", "next", "to")}

LEFT_BOUNDARIES = frozenset({",", ".", "while", "as", "where", "when"})
# After the second noun phrase: a word that cannot continue it (nouns, "'s", "of") ends nothing.
RIGHT_BOUNDARIES = _set(
    ". , ! ; is are and in on at into onto through across near by down up over under along around from to for "
    "as outside inside toward towards past during after together while")
# Verbs a clause goes on with after its subject (both numbers), so that the subject ends there.
CLAUSE_VERBS = _set(
    "walk walks run runs sit sits stand stands play plays pose poses smile smiles look looks jump jumps ride rides "
    "hold holds swim swims climb climbs dance dances wait waits talk talks eat eats drink drinks hug hugs kiss "
    "kisses fight fights race races chase chases cross crosses lean leans laugh laughs watch watches stare stares "
    "wade wades skate skates ski skis surf surfs kneel kneels splash splashes catch catches reach reaches carry "
    "carries lie lies lay lays")
ING_NOUNS = _set("clothing building ring swing thing string ceiling painting wedding railing")
ATTACHING = frozenset({"wearing", "dressed", "with", "'s", "of"})


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
    """The end of the clothing phrase at `i` ("in a red shirt and blue jeans"), or `i` when there is none
    (or it names no colour: then it carries no attribute to exchange)."""
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
        if end is not None and any(token in COLOURS for token in tokens[i:end]):
            return end
    return i


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
    pairs = []
    for start in range(len(tokens)):
        first = _noun_phrase(tokens, start)
        if first is None:
            continue
        for relation in DIRECTED_RELATIONS | SYMMETRIC_RELATIONS:
            if tuple(tokens[first.end:first.end + len(relation)]) != relation:
                continue
            second = _noun_phrase(tokens, first.end + len(relation))
            if second is not None and _ends_cleanly(tokens, second.end):
                pairs.append((first, second, relation))
    return sorted(pairs, key=lambda pair: (pair[0].start, pair[1].start, pair[2]))


def starts_clause(tokens: Sequence[str], phrase: NounPhrase) -> bool:
    """Whether `phrase` is a subject that can trade places: it starts the caption or a clause (not "the owner
    of a dog")."""
    return phrase.start == 0 or tokens[phrase.start - 1] in LEFT_BOUNDARIES


# --- rewrites -----------------------------------------------------------------------------------------------

def _exchange(tokens: list[str], first: tuple[int, int], second: tuple[int, int]) -> list[str]:
    """`tokens` with the spans `first` and `second` (first before second, not overlapping) exchanged."""
    (a, b), (c, d) = first, second
    return tokens[:a] + tokens[c:d] + tokens[b:c] + tokens[a:b] + tokens[d:]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" and not word.startswith(("uni", "use", "one", "eu")) else "a"


def _attire_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, symmetric: bool) -> list[list[str]]:
    if not (first.has_attire and second.has_attire) or first.kind != second.kind:
        return []
    worn_first, worn_second = tokens[first.head + 1:first.end], tokens[second.head + 1:second.end]
    # the same colours on both ("in red winter clothes" / "in red") bind nothing differently
    if COLOURS & set(worn_first) == COLOURS & set(worn_second) or (symmetric and tokens[first.start:first.head + 1]
                                     == tokens[second.start:second.head + 1]):
        return []
    for wearer, worn in ((first, worn_second), (second, worn_first)):
        if tokens[wearer.head] in MEN and WOMENS_GARMENTS & set(worn):
            return []
    return [_exchange(tokens, (first.head + 1, first.end), (second.head + 1, second.end))]


def _colour_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, symmetric: bool) -> list[list[str]]:
    if first.kind != "animal" or second.kind != "animal":
        return []
    colour_first, colour_second = tokens[first.start + 1:first.head], tokens[second.start + 1:second.head]
    if not (COLOURS & set(colour_first) and COLOURS & set(colour_second)) or colour_first == colour_second:
        return []
    if symmetric and tokens[first.head] == tokens[second.head]:
        return []
    swapped = _exchange(tokens, (first.start + 1, first.head), (second.start + 1, second.head))
    _fix_articles(swapped, (first.start, second.start + len(colour_second) - len(colour_first)))
    return [swapped]


def _garments(tokens: Sequence[str], phrase: NounPhrase) -> list[tuple[int, int]]:
    """(first modifier, head) of each garment of `phrase`'s clothing ("in a red shirt and blue jeans")."""
    opener = next(o for o in ATTIRE_OPENERS if tuple(tokens[phrase.head + 1:phrase.head + 1 + len(o)]) == o)
    found, i = [], phrase.head + 1 + len(opener)
    while i < phrase.end:
        i += tokens[i] in GARMENT_DETERMINERS
        head = _modifiers(tokens, i, GARMENT_MODIFIERS)
        if head >= phrase.end or tokens[head] not in GARMENTS:
            return []  # a colour alone: no garments
        found.append((i, head))
        i = head + 2  # past the head and the "and"
    return found


def _garment_colour_swaps(tokens: list[str]) -> list[list[str]]:
    """The colour phrases of two different garments one person wears exchanged ("a red shirt and blue jeans"
    -> "a blue shirt and red jeans"); garments with other modifiers (striped, long-sleeved) are left alone."""
    rewrites = []
    for start in range(len(tokens)):
        phrase = _noun_phrase(tokens, start)
        if phrase is None or phrase.kind != "person" or not phrase.has_attire:
            continue
        garments = _garments(tokens, phrase)
        for n, (first_start, first_head) in enumerate(garments):
            for second_start, second_head in garments[n + 1:]:
                first, second = tokens[first_start:first_head], tokens[second_start:second_head]
                if not all(_only_colours(words) for words in (first, second)) or first == second or (
                        tokens[first_head] == tokens[second_head]):
                    continue
                swapped = _exchange(tokens, (first_start, first_head), (second_start, second_head))
                _fix_articles(swapped, (first_start - 1, second_start - 1 + len(second) - len(first)))
                rewrites.append(swapped)
    return rewrites


def _only_colours(words: Sequence[str]) -> bool:
    return bool(words) and bool(COLOURS & set(words)) and all(w in COLOURS or w in SHADES or w == "and"
                                                              for w in words)


def _fix_articles(tokens: list[str], positions: Sequence[int]) -> None:
    """"a" or "an" at `positions` made to agree with the word after it (in place)."""
    for position in positions:
        if 0 <= position < len(tokens) - 1 and tokens[position] in ("a", "an"):
            tokens[position] = _article(tokens[position + 1])


def _object_swaps(tokens: list[str], first: NounPhrase, second: NounPhrase, relation) -> list[list[str]]:
    heads = {tokens[first.head], tokens[second.head]}
    if not starts_clause(tokens, first) or relation not in OBJECT_RELATIONS or first.number != second.number or len(heads) == 1 or heads & NOT_AGENTS:
        return []
    return [_exchange(tokens, (first.start, first.end), (second.start, second.end))]


def phrase_swaps(caption: str, kind: str) -> list[str]:
    """Every rewrite of `kind` ("swap_att" or "swap_obj") of `caption`, in a fixed order (may be empty)."""
    if kind not in KINDS:
        raise ValueError(f"phrase swap kind: expected one of {KINDS}, got {kind!r}")
    words = caption.split()
    if not words:
        return []
    capital = words[0][:1].isupper()
    tokens = [words[0][:1].lower() + words[0][1:]] + words[1:]
    rewrites = _garment_colour_swaps(tokens) if kind == "swap_att" else []
    for first, second, relation in related_pairs(tokens):
        if kind == "swap_obj":
            rewrites += _object_swaps(tokens, first, second, relation)
        else:
            symmetric = relation in SYMMETRIC_RELATIONS
            rewrites += _attire_swaps(tokens, first, second, symmetric)
            rewrites += _colour_swaps(tokens, first, second, symmetric)
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
    """Items `{"kind", "image", "caption", "caption_row", "negative_caption"}` per kind of `KINDS`, drawn as
    `lace.study.measure.sugarcrepe_style_items` draws the rule editor's: one rewrite per caption (rng seeded by
    kind and row; rewrites for which `exclude(caption, rewrite)` holds are not drawn), at most `per_kind` per
    kind (a seeded sample, kept in caption order)."""
    items = []
    for kind in KINDS:
        found = []
        for row, caption in enumerate(captions):
            rewrites = [text for text in phrase_swaps(caption, kind) if exclude is None or not exclude(caption, text)]
            if rewrites:
                negative = random.Random(f"phrase-{seed}-{kind}-{row}").choice(rewrites)
                found.append({"kind": kind, "image": int(caption_image_index[row]), "caption": caption,
                              "caption_row": row, "negative_caption": negative})
        if len(found) > per_kind:
            keep = sorted(random.Random(f"phrase-{seed}-{kind}").sample(range(len(found)), per_kind))
            found = [found[i] for i in keep]
        items.extend(found)
    return items


__all__ = ["KINDS", "VERSION", "NounPhrase", "phrase_swap", "phrase_swap_items", "phrase_swaps", "related_pairs"]

"""The lexicon of the swap-item writer (`lace.study.phrase_swaps`): its own small word lists, written apart from
the rule editor's vocabulary (`lace.concepts`), which it never reads.

People, animals, things, garments and places with their number; the words that may stand before a head (colours,
shades, materials, sizes and ages); relations between two noun phrases by whether their two directions differ and
are both plausible; and the words that end a phrase or a clause. A change here changes the writer's items:
`lace.study.phrase_swaps.VERSION` follows it.
"""

from __future__ import annotations


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


COLOURS = _set(
    "red blue green yellow black white brown pink orange purple gray grey tan gold golden silver beige maroon "
    "teal navy turquoise khaki cream burgundy lime violet olive aqua neon bronze copper ivory magenta crimson")
SHADES = _set("dark light bright pale")
MATERIALS = _set("brick stone wooden wood metal glass concrete plastic red-brick")
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


def _singulars(pairs: str) -> dict[str, str]:
    """'man/men woman/women' -> {'man': 'man', 'men': 'man', ...}."""
    return {form: pair.split("/")[0] for pair in pairs.split() for form in pair.split("/")}


PEOPLE = _forms("man/men woman/women boy/boys girl/girls child/children kid/kids person/people lady/ladies guy/guys "
                "toddler/toddlers teenager/teenagers baby/babies player/players runner/runners skier/skiers "
                "biker/bikers cyclist/cyclists rider/riders surfer/surfers swimmer/swimmers dancer/dancers "
                "worker/workers climber/climbers skateboarder/skateboarders snowboarder/snowboarders "
                "athlete/athletes musician/musicians performer/performers officer/officers policeman/policemen "
                "soldier/soldiers wrestler/wrestlers boxer/boxers gymnast/gymnasts goalie/goalies")
ANIMAL_NAMES = ("dog/dogs puppy/puppies cat/cats horse/horses cow/cows bird/birds duck/ducks goat/goats pony/ponies "
                 "bull/bulls animal/animals kitten/kittens camel/camels kitty/kitties "
                "lamb/lambs")
ANIMALS = _forms(ANIMAL_NAMES)
# Things whose colour a caption names and that no person or animal wears: the heads of colour phrases besides the
# animals and the garments.
THING_NAMES = (
    "ball/balls frisbee/frisbees toy/toys stick/sticks bike/bikes bicycle/bicycles car/cars truck/trucks "
    "boat/boats kayak/kayaks canoe/canoes raft/rafts bus/buses motorcycle/motorcycles scooter/scooters "
    "skateboard/skateboards surfboard/surfboards snowboard/snowboards sled/sleds umbrella/umbrellas kite/kites "
    "tent/tents chair/chairs bench/benches door/doors wall/walls fence/fences building/buildings house/houses "
    "balloon/balloons bag/bags backpack/backpacks rope/ropes leash/leashes flag/flags sign/signs tube/tubes "
    "bucket/buckets hose/hoses slide/slides tractor/tractors van/vans jeep/jeeps wagon/wagons cart/carts "
    "tricycle/tricycles stroller/strollers table/tables couch/couches sofa/sofas blanket/blankets towel/towels "
    "guitar/guitars microphone/microphones bat/bats racket/rackets cone/cones hoop/hoops net/nets pole/poles "
    "ladder/ladders barrel/barrels box/boxes basket/baskets cup/cups bottle/bottles banner/banners "
    "train/trains plane/planes airplane/airplanes helicopter/helicopters jet/jets paddle/paddles float/floats "
    "pool/pools tarp/tarps motorbike/motorbikes tire/tires wheel/wheels rail/rails ramp/ramps mat/mats sail/sails "
    "parachute/parachutes tunnel/tunnels hurdle/hurdles goal/goals bowl/bowls disc/discs frame/frames")
THINGS = _forms(THING_NAMES)
GARMENTS = _set(
    "shirt shirts t-shirt t-shirts tshirt dress dresses jacket jackets coat coats hat hats cap caps helmet helmets "
    "top tops sweater sweaters sweatshirt sweatshirts hoodie hoodies pants shorts jeans skirt skirts uniform "
    "uniforms suit suits swimsuit swimsuits bikini bikinis outfit outfits costume costumes vest vests scarf gloves "
    "boots shoes sneakers socks bandana headband goggles wetsuit wetsuits trunks jersey jerseys gown apron "
    "overalls leggings tights beanie hood collar harness sunglasses clothes clothing cape robe robes shawl mittens "
    "tutu leotard leotards poncho raincoat parka blazer tie belt mask wig necklace glove sweatpants bandanna "
    "glasses backpack")
WOMENS_GARMENTS = _set("dress skirt bikini gown")  # singular: see `lace.study.phrase_swaps._worn`
NOT_AGENTS = frozenset({"baby", "babies"})  # "a baby pushes a man": not a plausible exchange
MEN = _set("man men boy boys guy guys")
ENTITY_DETERMINERS = _set("a an another the one two three four several some")
GARMENT_DETERMINERS = _set("a an the")
ATTIRE_OPENERS = (("dressed", "in"), ("in",), ("wearing",), ("with",))


def _other_forms(pairs: str) -> dict[str, str]:
    """'chase/chases' -> {'chase': 'chases', 'chases': 'chase'}."""
    found = {}
    for pair in pairs.split():
        plain, third = pair.split("/")
        found[plain], found[third] = third, plain
    return found


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
# Where one thing stands relative to another: the two can trade places, a thing keeping still ("a man stands in
# front of a brick wall" -> "a brick wall stands in front of a man").
PLACES = frozenset({("in", "front", "of"), ("behind",)})
STILL_VERBS = frozenset({(), ("is",), ("are",)}) | {prefix + (verb,) for prefix in ((), ("is",), ("are",))
                                                      for verb in ("standing", "sitting")} | {
    (verb,) for verb in ("stands", "stand", "sits", "sit")}
# Things a person or an animal stands in front of or behind (besides `THINGS`); not "the camera", which is unseen.
PLACE_NAMES = (
    "building/buildings wall/walls house/houses store/stores shop/shops window/windows tree/trees statue/statues "
    "fountain/fountains church/churches mural/murals painting/paintings curtain/curtains "
    "backdrop/backdrops waterfall/waterfalls stage/stages display/displays machine/machines rock/rocks "
    "bush/bushes gate/gates doorway/doorways archway/archways truck/trucks sculpture/sculptures")
PLACE_THINGS = _forms(PLACE_NAMES) | THINGS
# Relations that read the same both ways: an exchange across them must change which one is which.
SYMMETRIC_RELATIONS = frozenset({("and",), ("with",), ("beside",), ("next", "to")}) | _verb_connectors(
    "stand/stands/standing+next_to sit/sits/sitting+next_to play/plays/playing+with walk/walks/walking+with "
    "talk/talks/talking+to talk/talks/talking+with wrestle/wrestles/wrestling+with fight/fights/fighting+with "
    "fight/fights/fighting stand/stands/standing+with sit/sits/sitting+with pose/poses/posing+with "
    "dance/dances/dancing+with") | {("is", "next", "to"), ("are", "next", "to")}

# Directed relations whose two directions are both plausible when both sides are people or both are animals
# ("a man carries a boy" / "a boy carries a man"), not when one is a person and the other an animal.
SAME_KIND_RELATIONS = OBJECT_RELATIONS | _verb_connectors(
    "hold/holds/holding carry/carries/carrying lift/lifts/lifting help/helps/helping bite/bites/biting "
    "lick/licks/licking sniff/sniffs/sniffing nuzzle/nuzzles/nuzzling jump/jumps/jumping+on "
    "jump/jumps/jumping+up_at take/takes/taking+a_picture_of photograph/photographs/photographing "
    "attack/attacks/attacking pin/pins/pinning kick/kicks/kicking") | {
    prefix + (done, "by") for prefix in ((), ("is",), ("are",), ("is", "being"), ("are", "being"), ("being",))
    for done in ("held", "carried", "lifted", "helped", "bitten", "attacked")}
# A finite verb and its form for the other number, so that a subject of the other number can take its place.
OTHER_NUMBER = {"is": "are", "are": "is"} | _other_forms(
    "chase/chases follow/follows watch/watches push/pushes pull/pulls lead/leads tackle/tackles look/looks "
    "stare/stares jump/jumps run/runs walk/walks stand/stands sit/sits spray/sprays splash/splashes hold/holds "
    "carry/carries lift/lifts help/helps bite/bites lick/licks sniff/sniffs nuzzle/nuzzles take/takes "
    "photograph/photographs attack/attacks pin/pins kick/kicks")
# Colours an animal may have: a garment's or a thing's colour phrase moves onto an animal only when it names these.
ANIMAL_COLOURS = _set("black white brown tan gray grey golden gold beige blond blonde dark light red yellow")
# Heads a reader takes for the same kind of thing: an exchange between two of them across "and" changes nothing.
HEAD_CLASSES = _singulars(ANIMAL_NAMES) | _singulars(THING_NAMES) | {
    word: "dog" for word in ("dog", "dogs", "puppy", "puppies")} | {
    word: "cat" for word in ("cat", "cats", "kitten", "kittens")} | {
    word: "horse" for word in ("horse", "horses", "pony", "ponies")} | {
    word: "bike" for word in ("bike", "bikes", "bicycle", "bicycles")}
PERSON_CLASSES = {"man": "man", "men": "man", "guy": "man", "guys": "man", "woman": "woman", "women": "woman",
                  "lady": "woman", "ladies": "woman", "boy": "boy", "boys": "boy", "girl": "girl", "girls": "girl",
                  "person": "person", "people": "person"} | {word: "person" for word in _set(
                      "player players runner runners skier skiers biker bikers cyclist cyclists rider riders "
                      "surfer surfers swimmer swimmers dancer dancers worker workers climber climbers skateboarder "
                      "skateboarders snowboarder snowboarders athlete athletes musician musicians performer "
                      "performers officer officers policeman policemen soldier soldiers wrestler wrestlers boxer "
                      "boxers gymnast gymnasts goalie goalies")} | {word: "child" for word in _set(
                      "child children kid kids toddler toddlers baby babies teenager teenagers")}
# Size and age words by side: an exchange must carry one side's word to the other ("little" for "small" says nothing).
SIZES = (_set("little small smaller tiny"), _set("big bigger large larger huge giant"))
AGES = (_set("young younger"), _set("old older elderly"))
CHILDREN = _set("child children kid kids toddler toddlers baby babies")
# Relations a child does not do to an adult ("a child carries a woman").
CARRYING = _set("hold holds holding held carry carries carrying carried lift lifts lifting lifted")
# What a person and an animal can both be doing, so that the subjects of two clauses may trade places.
SHARED_VERBS = _set(
    "run runs running walk walks walking sit sits sitting stand stands standing watch watches watching look looks "
    "looking jump jumps jumping swim swims swimming play plays playing lie lies lying lay lays laying wait waits "
    "waiting wade wades wading")
POSSESSIVES = _set("his her their its")
RELATIVES = _set("that which who whose")
REFERRING = _set("another other")  # "... in front of another boy": which one depends on who came first
GENDERED_PRONOUNS = _set("he him his himself she her hers herself")
MALE, FEMALE = _set("man men boy boys guy guys"), _set("woman women girl girls lady ladies")
# Words between two clauses whose subjects may trade places ("a man sits while a woman stands").
CLAUSE_JOINS = _set("while whilst as and , where when")

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

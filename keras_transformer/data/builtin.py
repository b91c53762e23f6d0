"""A built-in English-German corpus, generated from a small grammar.

It needs no download, and its pairs carry what makes translating into German
more than word-for-word substitution:

- gender and case agreement of articles and adjectives: "the big dog" is
  "der große Hund" as a subject, "den großen Hund" as an object, and
  "dem großen Hund" after "helps" or "with";
- verb-second order after a fronted adverb or clause: "Today the cat sees
  the dog." is "Heute sieht die Katze den Hund.";
- verb-final subordinate clauses: "... because the cat sees the dog." is
  "..., weil die Katze den Hund sieht.";
- contractions ("in the garden" is "im Garten") and negation placement
  ("does not see the dog" is "sieht den Hund nicht").
"""

import dataclasses
import random
import zlib

from keras_transformer.data.corpus import ParallelCorpus

MASCULINE, FEMININE, NEUTER = "m", "f", "n"
NOMINATIVE, ACCUSATIVE, DATIVE = "nom", "acc", "dat"

# English noun -> (German noun, gender). Only strong nouns, whose singular
# does not change with case.
ANIMATE_NOUNS = {
    "dog": ("Hund", MASCULINE),
    "man": ("Mann", MASCULINE),
    "teacher": ("Lehrer", MASCULINE),
    "doctor": ("Arzt", MASCULINE),
    "cook": ("Koch", MASCULINE),
    "bird": ("Vogel", MASCULINE),
    "cat": ("Katze", FEMININE),
    "woman": ("Frau", FEMININE),
    "mouse": ("Maus", FEMININE),
    "sister": ("Schwester", FEMININE),
    "mother": ("Mutter", FEMININE),
    "child": ("Kind", NEUTER),
    "girl": ("Mädchen", NEUTER),
    "horse": ("Pferd", NEUTER),
}
THING_NOUNS = {
    "ball": ("Ball", MASCULINE),
    "letter": ("Brief", MASCULINE),
    "key": ("Schlüssel", MASCULINE),
    "apple": ("Apfel", MASCULINE),
    "lamp": ("Lampe", FEMININE),
    "flower": ("Blume", FEMININE),
    "bag": ("Tasche", FEMININE),
    "newspaper": ("Zeitung", FEMININE),
    "book": ("Buch", NEUTER),
    "picture": ("Bild", NEUTER),
    "bread": ("Brot", NEUTER),
    "bicycle": ("Fahrrad", NEUTER),
}
PLACE_NOUNS = {
    "garden": ("Garten", MASCULINE),
    "park": ("Park", MASCULINE),
    "kitchen": ("Küche", FEMININE),
    "city": ("Stadt", FEMININE),
    "school": ("Schule", FEMININE),
    "house": ("Haus", NEUTER),
    "village": ("Dorf", NEUTER),
}
ADJECTIVES = {
    "big": "groß",
    "small": "klein",
    "old": "alt",
    "young": "jung",
    "red": "rot",
    "black": "schwarz",
    "white": "weiß",
    "new": "neu",
    "tired": "müde",
    "beautiful": "schön",
    "quick": "schnell",
    "brown": "braun",
}


@dataclasses.dataclass(frozen=True)
class Verb:
    """A verb: English base and third-person forms, German third person,
    and the German case of each object."""

    english: str
    english_third_person: str
    german: str
    object_cases: tuple


VERBS = [
    Verb("see", "sees", "sieht", (ACCUSATIVE,)),
    Verb("hear", "hears", "hört", (ACCUSATIVE,)),
    Verb("find", "finds", "findet", (ACCUSATIVE,)),
    Verb("look for", "looks for", "sucht", (ACCUSATIVE,)),
    Verb("know", "knows", "kennt", (ACCUSATIVE,)),
    Verb("like", "likes", "mag", (ACCUSATIVE,)),
    Verb("visit", "visits", "besucht", (ACCUSATIVE,)),
    Verb("watch", "watches", "beobachtet", (ACCUSATIVE,)),
    Verb("help", "helps", "hilft", (DATIVE,)),
    Verb("follow", "follows", "folgt", (DATIVE,)),
    Verb("thank", "thanks", "dankt", (DATIVE,)),
    Verb("answer", "answers", "antwortet", (DATIVE,)),
    # Ditransitive: "gives the dog a ball" -> "gibt dem Hund einen Ball".
    Verb("give", "gives", "gibt", (DATIVE, ACCUSATIVE)),
    Verb("show", "shows", "zeigt", (DATIVE, ACCUSATIVE)),
]
ADVERBS = {
    "today": "heute",
    "tomorrow": "morgen",
    "now": "jetzt",
    "often": "oft",
    "sometimes": "manchmal",
    "later": "später",
    "suddenly": "plötzlich",
    "unfortunately": "leider",
}
SUBORDINATORS = {
    "because": "weil",
    "although": "obwohl",
    "while": "während",
    "if": "wenn",
}
# Prepositions that take the dative, and their contractions with "dem".
PREPOSITIONS = {
    "in": ("in", "im"),
    "near": ("bei", "beim"),
    "with": ("mit", None),
}

DEFINITE_ARTICLES = {
    NOMINATIVE: {MASCULINE: "der", FEMININE: "die", NEUTER: "das"},
    ACCUSATIVE: {MASCULINE: "den", FEMININE: "die", NEUTER: "das"},
    DATIVE: {MASCULINE: "dem", FEMININE: "der", NEUTER: "dem"},
}
INDEFINITE_ENDINGS = {  # ein + ending
    NOMINATIVE: {MASCULINE: "", FEMININE: "e", NEUTER: ""},
    ACCUSATIVE: {MASCULINE: "en", FEMININE: "e", NEUTER: ""},
    DATIVE: {MASCULINE: "em", FEMININE: "er", NEUTER: "em"},
}
# Adjective endings after a definite article (weak declension) ...
WEAK_ENDINGS = {
    NOMINATIVE: {MASCULINE: "e", FEMININE: "e", NEUTER: "e"},
    ACCUSATIVE: {MASCULINE: "en", FEMININE: "e", NEUTER: "e"},
    DATIVE: {MASCULINE: "en", FEMININE: "en", NEUTER: "en"},
}
# ... and after "ein" (mixed declension), where the adjective shows the
# gender that "ein" does not.
MIXED_ENDINGS = {
    NOMINATIVE: {MASCULINE: "er", FEMININE: "e", NEUTER: "es"},
    ACCUSATIVE: {MASCULINE: "en", FEMININE: "e", NEUTER: "es"},
    DATIVE: {MASCULINE: "en", FEMININE: "en", NEUTER: "en"},
}


@dataclasses.dataclass(frozen=True)
class NounPhrase:
    """An English noun with an optional adjective, definite or indefinite."""

    noun: str
    adjective: str = None
    definite: bool = True

    def english(self):
        words = [self.adjective, self.noun] if self.adjective else [self.noun]
        if self.definite:
            return " ".join(["the"] + words)
        article = "an" if words[0][0] in "aeiou" else "a"
        return " ".join([article] + words)

    def german(self, case):
        noun, gender = _GERMAN_NOUNS[self.noun]
        if self.definite:
            article = DEFINITE_ARTICLES[case][gender]
            endings = WEAK_ENDINGS
        else:
            article = "ein" + INDEFINITE_ENDINGS[case][gender]
            endings = MIXED_ENDINGS
        if self.adjective is None:
            return f"{article} {noun}"
        stem = ADJECTIVES[self.adjective]
        ending = endings[case][gender]
        # "müde" + "e" is "müde", not "müdee".
        adjective = stem + (ending[1:] if stem.endswith("e") else ending)
        return f"{article} {adjective} {noun}"


_GERMAN_NOUNS = {**ANIMATE_NOUNS, **THING_NOUNS, **PLACE_NOUNS}


@dataclasses.dataclass(frozen=True)
class Clause:
    """Subject, verb, objects, and an optional place, negation and adverb.

    `objects` holds one noun phrase per entry of `verb.object_cases`.
    `place` is a (preposition, NounPhrase) pair or None.
    """

    subject: NounPhrase
    verb: Verb
    objects: tuple
    place: tuple = None
    negated: bool = False

    def english(self):
        if self.negated:
            verb = f"does not {self.verb.english}"
        else:
            verb = self.verb.english_third_person
        words = [self.subject.english(), verb]
        words += [phrase.english() for phrase in self.objects]
        if self.place is not None:
            preposition, phrase = self.place
            words += [preposition, phrase.english()]
        return " ".join(words)

    def german_parts(self):
        """(subject, finite verb, the rest in main-clause order)."""
        rest = [
            phrase.german(case)
            for phrase, case in zip(self.objects, self.verb.object_cases)
        ]
        if self.place is not None:
            rest.append(_german_place(*self.place))
        if self.negated:
            rest.append("nicht")
        return self.subject.german(NOMINATIVE), self.verb.german, rest

    def german_main(self, fronted=None):
        """Verb second: after the subject, or after a fronted element."""
        subject, verb, rest = self.german_parts()
        if fronted is None:
            return " ".join([subject, verb] + rest)
        return " ".join([fronted, verb, subject] + rest)

    def german_subordinate(self):
        """Verb last: "weil die Katze den Hund sieht"."""
        subject, verb, rest = self.german_parts()
        return " ".join([subject] + rest + [verb])


def _german_place(preposition, phrase):
    german, contracted = PREPOSITIONS[preposition]
    text = phrase.german(DATIVE)
    if contracted and text.startswith("dem "):
        return f"{contracted} {text[len('dem '):]}"
    return f"{german} {text}"


@dataclasses.dataclass(frozen=True)
class Sentence:
    """A main clause with an optional fronted adverb and subordinate clause.

    With `subordinate_first`, the subordinate clause opens the sentence and
    the main clause follows with its verb first: "Weil ..., sieht die Katze
    den Hund."
    """

    main: Clause
    adverb: str = None
    subordinator: str = None
    subordinate: Clause = None
    subordinate_first: bool = False

    def english(self):
        main = self.main.english()
        if self.adverb:
            main = f"{self.adverb} {main}"
        if self.subordinate is None:
            text = main
        elif self.subordinate_first:
            text = f"{self.subordinator} {self.subordinate.english()}, {main}"
        else:
            text = f"{main} {self.subordinator} {self.subordinate.english()}"
        return _sentence_case(text) + "."

    def german(self):
        subordinate = None
        if self.subordinate is not None:
            subordinate = (
                f"{SUBORDINATORS[self.subordinator]} "
                f"{self.subordinate.german_subordinate()}"
            )
        if self.subordinate_first:
            # The whole clause fills the first position: the verb follows it.
            text = self.main.german_main(fronted=subordinate + ",")
        else:
            fronted = ADVERBS[self.adverb] if self.adverb else None
            text = self.main.german_main(fronted=fronted)
            if subordinate is not None:
                text = f"{text}, {subordinate}"
        return _sentence_case(text) + "."


def _sentence_case(text):
    return text[0].upper() + text[1:]


def _noun_phrase(rng, nouns):
    return NounPhrase(
        noun=rng.choice(sorted(nouns)),
        adjective=rng.choice(sorted(ADJECTIVES)) if rng.random() < 0.4 else None,
        definite=rng.random() < 0.65,
    )


def _clause(rng, allow_negation=True):
    verb = rng.choice(VERBS)
    objects = []
    ditransitive = len(verb.object_cases) == 2
    for case in verb.object_cases:
        if case == DATIVE:
            pool = ANIMATE_NOUNS  # the one helped, followed, given to
        elif ditransitive:
            pool = THING_NOUNS  # the thing given or shown
        else:
            pool = {**ANIMATE_NOUNS, **THING_NOUNS}
        objects.append(_noun_phrase(rng, pool))
    place = None
    negated = False
    if rng.random() < 0.25:
        preposition = rng.choice(sorted(PREPOSITIONS))
        pool = ANIMATE_NOUNS if preposition == "with" else PLACE_NOUNS
        place = (preposition, _noun_phrase(rng, pool))
    elif allow_negation and rng.random() < 0.15 and all(o.definite for o in objects):
        # "nicht" after definite objects; indefinite ones would need "kein".
        negated = True
    return Clause(_noun_phrase(rng, ANIMATE_NOUNS), verb, tuple(objects), place, negated)


def random_sentence(rng):
    """One random `Sentence`: about a third each plain, with a fronted
    adverb, and with a subordinate clause (a quarter of those fronted)."""
    kind = rng.random()
    main = _clause(rng)
    if kind < 0.35:
        return Sentence(main)
    if kind < 0.65:
        return Sentence(main, adverb=rng.choice(sorted(ADVERBS)))
    return Sentence(
        main,
        subordinator=rng.choice(sorted(SUBORDINATORS)),
        subordinate=_clause(rng),
        subordinate_first=rng.random() < 0.25,
    )


SPLITS = {"train": (0, 90), "valid": (90, 95), "test": (95, 100)}
DEFAULT_SIZES = {"train": 20000, "valid": 500, "test": 500}


def _split_of(english):
    """A stable split for each distinct English sentence, so that no
    sentence is in two splits, whatever the seed."""
    bucket = zlib.crc32(english.encode("utf-8")) % 100
    for split, (low, high) in SPLITS.items():
        if low <= bucket < high:
            return split


def builtin_corpus(split, size=None, seed=0):
    """English-German pairs from the built-in grammar.

    Deterministic: the same split, size and seed give the same pairs. A
    sentence belongs to one split only (by a hash of its English side), and
    no pair repeats within a split.

    Args:
        split: `"train"`, `"valid"` or `"test"`.
        size: the number of pairs; 20000 for train and 500 for the others
            by default.
        seed: the random seed.

    Returns:
        A `ParallelCorpus`.
    """
    if split not in SPLITS:
        raise ValueError(
            f"Unknown split. Expected one of {list(SPLITS)}. "
            f"Received: split={split!r}"
        )
    size = DEFAULT_SIZES[split] if size is None else size
    if size < 1:
        raise ValueError(f"`size` must be positive. Received: size={size}")
    rng = random.Random(seed)
    sources, targets, seen = [], [], set()
    attempts = 0
    while len(sources) < size:
        attempts += 1
        if attempts > 100 * size + 10000:
            raise ValueError(
                f"The grammar could not produce {size} distinct pairs for "
                f"split {split!r}. Received: size={size}"
            )
        sentence = random_sentence(rng)
        english = sentence.english()
        if english in seen or _split_of(english) != split:
            continue
        seen.add(english)
        sources.append(english)
        targets.append(sentence.german())
    return ParallelCorpus(
        tuple(sources), tuple(targets), name=f"builtin:{split}:seed={seed}"
    )

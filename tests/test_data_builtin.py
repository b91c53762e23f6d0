import re

import pytest

from keras_transformer.data import builtin_corpus
from keras_transformer.data.builtin import Clause
from keras_transformer.data.builtin import NounPhrase
from keras_transformer.data.builtin import Sentence
from keras_transformer.data.builtin import VERBS

VERB = {verb.english: verb for verb in VERBS}


def phrase(noun, adjective=None, definite=True):
    return NounPhrase(noun, adjective, definite)


# Each German sentence here was written by hand, not by the generator.
@pytest.mark.parametrize(
    "sentence, english, german",
    [
        (
            Sentence(Clause(phrase("cat"), VERB["see"], (phrase("dog"),))),
            "The cat sees the dog.",
            "Die Katze sieht den Hund.",
        ),
        (
            Sentence(Clause(phrase("cat"), VERB["see"], (phrase("dog"),)), adverb="today"),
            "Today the cat sees the dog.",
            "Heute sieht die Katze den Hund.",
        ),
        (
            Sentence(
                Clause(phrase("man"), VERB["help"], (phrase("woman"),)),
                subordinator="because",
                subordinate=Clause(phrase("cat"), VERB["see"], (phrase("dog"),)),
            ),
            "The man helps the woman because the cat sees the dog.",
            "Der Mann hilft der Frau, weil die Katze den Hund sieht.",
        ),
        (
            Sentence(
                Clause(
                    phrase("dog", "big", definite=False),
                    VERB["give"],
                    (phrase("child"), phrase("book", "old", definite=False)),
                )
            ),
            "A big dog gives the child an old book.",
            "Ein großer Hund gibt dem Kind ein altes Buch.",
        ),
        (
            Sentence(
                Clause(
                    phrase("cat", "small"),
                    VERB["see"],
                    (phrase("dog", "big"),),
                    place=("in", phrase("garden")),
                )
            ),
            "The small cat sees the big dog in the garden.",
            "Die kleine Katze sieht den großen Hund im Garten.",
        ),
        (
            Sentence(
                Clause(phrase("girl", "tired"), VERB["follow"], (phrase("teacher", "young", definite=False),)),
                adverb="often",
            ),
            "Often the tired girl follows a young teacher.",
            "Oft folgt das müde Mädchen einem jungen Lehrer.",
        ),
        (
            Sentence(
                Clause(phrase("mouse"), VERB["like"], (phrase("bread"),)),
                subordinator="although",
                subordinate=Clause(phrase("horse"), VERB["see"], (phrase("cat"),), negated=True),
                subordinate_first=True,
            ),
            "Although the horse does not see the cat, the mouse likes the bread.",
            "Obwohl das Pferd die Katze nicht sieht, mag die Maus das Brot.",
        ),
        (
            Sentence(
                Clause(
                    phrase("woman"), VERB["look for"], (phrase("key", "red", definite=False),),
                    place=("near", phrase("house", "white", definite=False)),
                )
            ),
            "The woman looks for a red key near a white house.",
            "Die Frau sucht einen roten Schlüssel bei einem weißen Haus.",
        ),
    ],
)
def test_grammar_renders_hand_checked_translations(sentence, english, german):
    assert sentence.english() == english
    assert sentence.german() == german


# Independent of the generator's tables: what a German grammar says.
GENDER = {
    "Hund": "m", "Mann": "m", "Lehrer": "m", "Arzt": "m", "Koch": "m", "Vogel": "m",
    "Ball": "m", "Brief": "m", "Schlüssel": "m", "Apfel": "m", "Garten": "m", "Park": "m",
    "Katze": "f", "Frau": "f", "Maus": "f", "Schwester": "f", "Mutter": "f", "Lampe": "f",
    "Blume": "f", "Tasche": "f", "Zeitung": "f", "Küche": "f", "Stadt": "f", "Schule": "f",
    "Kind": "n", "Mädchen": "n", "Pferd": "n", "Buch": "n", "Bild": "n", "Brot": "n",
    "Fahrrad": "n", "Haus": "n", "Dorf": "n",
}
# (article, gender) -> the adjective endings German allows there.
ADJECTIVE_ENDINGS = {
    ("der", "m"): {"e"}, ("der", "f"): {"en"}, ("die", "f"): {"e"},
    ("das", "n"): {"e"}, ("den", "m"): {"en"}, ("dem", "m"): {"en"}, ("dem", "n"): {"en"},
    ("ein", "m"): {"er"}, ("ein", "n"): {"es"}, ("eine", "f"): {"e"},
    ("einen", "m"): {"en"}, ("einem", "m"): {"en"}, ("einem", "n"): {"en"},
    ("einer", "f"): {"en"}, ("im", "m"): {"en"}, ("im", "n"): {"en"},
    ("beim", "m"): {"en"}, ("beim", "n"): {"en"},
}
FINITE_VERBS = {
    "sieht", "hört", "findet", "sucht", "kennt", "mag", "besucht", "beobachtet",
    "hilft", "folgt", "dankt", "antwortet", "gibt", "zeigt",
}
ADVERBS = {"heute", "morgen", "jetzt", "oft", "manchmal", "später", "plötzlich", "leider"}


@pytest.fixture(scope="module")
def corpus():
    return builtin_corpus("train", size=3000, seed=7)


def test_articles_and_adjectives_agree_with_the_noun(corpus):
    checked = 0
    for _, german in corpus:
        words = re.findall(r"\w+", german)
        for i, word in enumerate(words):
            if word not in GENDER:
                continue
            gender = GENDER[word]
            article, adjective = words[i - 1].lower(), None
            if (article, gender) not in ADJECTIVE_ENDINGS:
                article, adjective = words[i - 2].lower(), words[i - 1]
            assert (article, gender) in ADJECTIVE_ENDINGS, (german, word)
            if adjective is not None:
                ending = adjective[-2:] if adjective[-2:] in {"er", "es", "en"} else adjective[-1:]
                allowed = ADJECTIVE_ENDINGS[(article, gender)]
                # "müde" keeps its own e: müde, müden, müder, müdes.
                assert ending in allowed or (adjective == "müde" and allowed == {"e"}), (german, adjective)
            checked += 1
    assert checked > 5000


def test_verb_second_after_a_fronted_adverb(corpus):
    fronted = [german for _, german in corpus if german.split()[0].lower() in ADVERBS]
    assert len(fronted) > 500
    for german in fronted:
        assert german.split()[1] in FINITE_VERBS, german


def test_verb_final_in_subordinate_clauses(corpus):
    subordinate = 0
    for english, german in corpus:
        for clause in re.findall(r"\b(?:weil|obwohl|während|wenn) ([^,.]+)", german):
            subordinate += 1
            assert clause.split()[-1] in FINITE_VERBS, german
            assert not set(clause.split()[:-1]) & FINITE_VERBS, german
        # A fronted subordinate clause is followed by the main verb.
        if german.split()[0] in {"Weil", "Obwohl", "Während", "Wenn"}:
            assert german.split(", ")[1].split()[0] in FINITE_VERBS, german
    assert subordinate > 500


def test_deterministic_and_splits_are_disjoint():
    assert list(builtin_corpus("valid", size=50, seed=3)) == list(builtin_corpus("valid", size=50, seed=3))
    assert list(builtin_corpus("valid", size=50, seed=3)) != list(builtin_corpus("valid", size=50, seed=4))
    train = set(builtin_corpus("train", size=5000).sources)
    valid = set(builtin_corpus("valid").sources)
    test = set(builtin_corpus("test").sources)
    assert len(train) == 5000 and len(valid) == 500 and len(test) == 500
    assert not (train & valid) and not (train & test) and not (valid & test)


def test_bad_split_or_size_is_rejected():
    with pytest.raises(ValueError, match=r"Expected one of \['train', 'valid', 'test'\]. Received: split='dev'"):
        builtin_corpus("dev")
    with pytest.raises(ValueError, match="size=0"):
        builtin_corpus("test", size=0)

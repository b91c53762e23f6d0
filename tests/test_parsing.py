"""Constituency parsing (section 6.3): the treebank reader, linearization,
EVALB's bracket scores on hand-worked trees, and a decoder that writes only
trees."""

import os

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.parsing import Parser
from keras_transformer.parsing import ParsingVocabulary
from keras_transformer.parsing import Tree
from keras_transformer.parsing import bracket_scores
from keras_transformer.parsing import brackets
from keras_transformer.parsing import clean
from keras_transformer.parsing import delinearize
from keras_transformer.parsing import linearize
from keras_transformer.parsing import read_treebank
from keras_transformer.parsing import right_branching

from conftest import PTB_SAMPLE, in_one_pass, needs_ptb_sample

MRG = """
( (S
    (NP-SBJ-1 (NNP Mr.) (NNP Vinken) )
    (VP (VBZ is)
      (VP (VBN expected)
        (S (NP-SBJ (-NONE- *-1) )
          (VP (TO to) (VP (VB retire) )))))
    (. .) ))
( (S
    (NP-SBJ (DT The) (NN dog) )
    (VP (VBD barked) )
    (. .) ))
"""


def write(tmp_path, text, name="wsj_0001.mrg"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_trees_and_cleans_them_as_parsers_use_them(tmp_path):
    trees = read_treebank([write(tmp_path, MRG)])
    assert len(trees) == 2
    assert trees[0].label == "" and trees[0].children[0].label == "S"
    assert trees[0].words() == ["Mr.", "Vinken", "is", "expected", "*-1", "to", "retire", "."]
    cleaned = clean(trees[0])
    # No empty element (nor its NP, left empty), no function tag or index,
    # no unlabelled root.
    assert str(cleaned) == (
        "(S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (VP (VBN expected) "
        "(S (VP (TO to) (VP (VB retire)))))) (. .))"
    )
    assert cleaned.tags() == ["NNP", "NNP", "VBZ", "VBN", "TO", "VB", "."]


@pytest.mark.parametrize(
    "text, message",
    [
        ("( (S (NP (DT the) (NN dog)) )\n(VP x)) )", r"line 2: '\)' closes nothing"),
        ("( (S (NP (DT the) (NN dog)\n", r"line 1: 3 bracket\(s\) left open"),
        ("( (S (NP (DT the) dog) ))", r"the word 'dog' follows other children"),
        ("dog ( (S (NN dog)) )", r"line 1: 'dog' outside any bracket"),
        ("( (S (NP ) (NN dog)) )", r"an empty constituent \(NP\)"),
        ("\n\n", r"no tree found"),
    ],
)
def test_a_malformed_file_is_an_error_that_names_it_and_the_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as error:
        read_treebank([path])
    assert str(path) in str(error.value)


TREE = Tree.from_string("(S (NP (DT The) (NN dog)) (VP (VBD chased) (NP (DT the) (NN cat))) (. .))")


def test_linearization_round_trips():
    tokens = linearize(TREE)
    assert tokens == ["(S", "(NP", "XX", "XX", ")", "(VP", "XX", "(NP", "XX", "XX", ")", ")", "XX", ")"]
    assert delinearize(tokens, TREE.words(), TREE.tags()) == TREE
    # Without tags, the leaves are tagged XX.
    assert delinearize(tokens, TREE.words()).tags() == ["XX"] * 6
    # With the words themselves in place of XX.
    words = linearize(TREE, words=True)
    assert len(words) == len(tokens)
    assert [w for w, t in zip(words, tokens) if t == "XX"] == TREE.words()
    assert all(w == t for w, t in zip(words, tokens) if t != "XX")


@pytest.mark.parametrize(
    "tokens, message",
    [
        (["(S", "XX", "XX", ")", ")"], r"a token after the root closed"),
        (["(S", "(NP", ")", "XX", "XX", ")"], r"an empty constituent \(NP\)"),
        (["XX", "(S", "XX", ")"], r"a word outside the root"),
        (["(S", "XX", "XX", "XX", ")"], r"more words than the sentence's 2"),
        (["(S", "XX", ")"], r"1 words where the sentence has 2"),
        (["(S", "XX", "XX"], r"brackets left open"),
        ([], r"no tree"),
        (["(S", "dog", ")"], r"the unknown token 'dog'"),
    ],
)
def test_delinearize_refuses_what_is_not_one_tree_over_the_words(tokens, message):
    with pytest.raises(ValueError, match=message):
        delinearize(tokens, ["a", "b"])


def test_right_branching_baseline():
    tree = right_branching(["a", "b", "c", "d"], ["X1", "X2", "X3", "X4"])
    assert str(tree) == "(S (X1 a) (NP (X2 b) (NP (X3 c) (X4 d))))"
    assert str(right_branching(["a"], ["X"])) == "(S (X a))"


# Hand-worked EVALB cases. Sentence 1, words The dog chased the cat . ("."
# is punctuation: 5 words, 0-4). Gold: S 0-4, NP 0-1, VP 2-4, NP 3-4. Test:
# S 0-4, NP 0-2, VP 3-4, NP 3-4. Matched: S 0-4 and NP 3-4, 2 of 4 each.
GOLD_1 = TREE
TEST_1 = Tree.from_string("(S (NP (DT The) (NN dog) (VBD chased)) (VP (NP (DT the) (NN cat))) (. .))")
# Sentence 2, words He gave up , quickly (the comma out: He 0, gave 1, up 2,
# quickly 3). Gold: S 0-3, NP 0-0, VP 1-2, PRT (= ADVP) 2-2, ADVP 3-3. Test:
# S 0-3, NP 0-0 twice, VP 1-3, ADVP 2-2, ADVP 3-3. Matched: S, one NP,
# ADVP 2-2 (PRT), ADVP 3-3: 4 of 6 test, 4 of 5 gold.
GOLD_2 = Tree.from_string("(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))) (, ,) (ADVP (RB quickly)))")
TEST_2 = Tree.from_string("(S (NP (NP (PRP He))) (VP (VBD gave) (ADVP (RP up)) (, ,) (ADVP (RB quickly))))")


def test_brackets_leave_out_punctuation_tags_and_unlabelled_roots():
    assert brackets(GOLD_1) == {("S", 0, 4): 1, ("NP", 0, 1): 1, ("VP", 2, 4): 1, ("NP", 3, 4): 1}
    assert brackets(TEST_2) == {("S", 0, 3): 1, ("NP", 0, 0): 2, ("VP", 1, 3): 1, ("ADVP", 2, 2): 1, ("ADVP", 3, 3): 1}
    # A constituent of punctuation alone is no bracket; nor is the root of TOP.
    only_punctuation = Tree.from_string("( (S (NP (NN a)) (PRN (, ,) (: --)) (VP (VB b))) )")
    assert brackets(only_punctuation) == {("S", 0, 1): 1, ("NP", 0, 0): 1, ("VP", 1, 1): 1}


def test_bracket_scores_match_the_hand_worked_ones():
    one = bracket_scores([GOLD_1], [TEST_1])
    assert (one["matched"], one["gold_brackets"], one["test_brackets"]) == (2, 4, 4)
    assert one["precision"] == one["recall"] == one["f1"] == 50.0
    two = bracket_scores([GOLD_2], [TEST_2])
    assert (two["matched"], two["gold_brackets"], two["test_brackets"]) == (4, 5, 6)
    assert two["precision"] == pytest.approx(400 / 6) and two["recall"] == 80.0
    assert two["f1"] == pytest.approx(2 * (400 / 6) * 80 / (400 / 6 + 80))  # 72.73
    # Over the corpus, counts add up (micro-average): 6 of 10 test, 6 of 9 gold.
    both = bracket_scores([GOLD_1, GOLD_2], [TEST_1, TEST_2])
    assert both["precision"] == 60.0 and both["recall"] == pytest.approx(600 / 9)
    assert both["f1"] == pytest.approx(2 * 60 * (600 / 9) / (60 + 600 / 9))  # 63.16
    assert both["exact"] == 0.0
    assert bracket_scores([GOLD_1, GOLD_2], [GOLD_1, GOLD_2])["f1"] == 100.0
    assert bracket_scores([GOLD_1, GOLD_2], [GOLD_1, GOLD_2])["exact"] == 100.0
    # Unlabelled, sentence 1 still matches 2 spans of 4 (NP 3-4 = VP 3-4 once).
    assert bracket_scores([GOLD_1], [TEST_1], labelled=False)["f1"] == 50.0


def test_bracket_scores_refuse_trees_over_other_words():
    other = Tree.from_string("(S (NP (DT A) (NN dog)) (VP (VBD chased) (NP (DT the) (NN cat))) (. .))")
    with pytest.raises(ValueError, match="Sentence 0: the test tree's words differ"):
        bracket_scores([GOLD_1], [other])
    with pytest.raises(ValueError, match="one test tree per gold tree"):
        bracket_scores([GOLD_1], [])


SENTENCES = [
    ["a"],
    ["the", "dog", "barked", "."],
    ["He", "gave", "up", ",", "quickly", "unseen-word", "1999"],
    ["x"] * 40,
]


@pytest.fixture(scope="module", params=["XX", "copied"])
def vocabulary(request):
    return ParsingVocabulary.build([GOLD_1, GOLD_2, TEST_1, TEST_2], min_count=1, target_words=request.param)


def test_vocabulary_reads_unknown_words_by_their_shape(vocabulary):
    ids = vocabulary.encode_sentence(["dog", "Zebra", "1999", "ex-wife", "zebra", "XX"])
    assert [vocabulary.tokens[i] for i in ids] == [
        "dog", "<unk-cap>", "<unk-num>", "<unk-hyphen>", "<unk>", "<unk-cap>", "</s>"
    ]
    target = vocabulary.encode_tree(GOLD_2)
    assert vocabulary.decode(target + [vocabulary.eos_id, 5]) == linearize(GOLD_2)
    # Copied words have the sentence's own ids where the other form has XX.
    words = [i for i, t in zip(target, linearize(GOLD_2)) if t == "XX"]
    if vocabulary.target_words == "copied":
        assert words == vocabulary.encode_sentence(GOLD_2.words())[:-1]
    else:
        assert set(words) == {vocabulary.ids["XX"]}
    with pytest.raises(ValueError, match=r"labels the vocabulary lacks: \['\(SBAR'\]"):
        vocabulary.encode_tree(Tree.from_string("(SBAR (NP (DT a)))"))


@pytest.mark.parametrize("beam_size, max_extra_length", [(1, 300), (3, 300), (4, 0)])
def test_every_parse_is_a_tree_over_the_sentence_whatever_the_weights(vocabulary, beam_size, max_extra_length):
    """An untrained model, whose outputs are arbitrary, still writes trees;
    even when the length limit leaves room for the flattest tree only."""
    # Another seed for each form of the words: differently arbitrary outputs.
    seed = ParsingVocabulary.TARGET_WORDS.index(vocabulary.target_words) + 1
    model = kt.build_transformer("tiny", vocabulary_size=len(vocabulary), num_layers=1, seed=seed)
    parser = Parser(model, vocabulary, beam_size=beam_size, max_extra_length=max_extra_length, batch_size=3)
    trees = parser.parse(SENTENCES)
    for words, tree in zip(SENTENCES, trees):
        assert tree.words() == words
        tokens = linearize(tree)
        assert len(tokens) + 1 <= len(words) + max(max_extra_length, 3)
        assert delinearize(tokens, words) == tree
    if max_extra_length == 0:
        # Room for W + 3 tokens: the root over every word, no more.
        assert all(len(tree.children) == len(words) for tree, words in zip(trees, SENTENCES))


def test_the_constraint_changes_only_what_would_break_the_tree(vocabulary):
    """Where the model's own best token keeps the tree well formed, the
    constrained search picks it: a model that always prefers the gold
    sequence's next token reproduces the gold tree. With copied words, a
    model that prefers another word where a word comes still writes the
    sentence's next one, with that preference for a word."""
    from keras_transformer.decoding import beam_search
    from keras_transformer.parsing import well_formed_steps

    gold = vocabulary.encode_tree(GOLD_2) + [vocabulary.eos_id]
    words = len(GOLD_2.words())
    source = np.array([vocabulary.encode_sentence(GOLD_2.words())] * 2, "int32")
    copied = vocabulary.target_words == "copied"
    wrong_word = vocabulary.ids["dog"]

    def search(preferred):
        def oracle(ids, index, state):
            best = keras.ops.take(keras.ops.convert_to_tensor(np.array(preferred + [0] * 400, "int32")), index)
            logits = keras.ops.one_hot(keras.ops.full((ids.shape[0],), best, dtype="int32"), len(vocabulary)) * 5.0
            return logits, state

        step = well_formed_steps(oracle, vocabulary.token_classes(), np.full((2,), words),
                                 np.full((2,), words + 300), source_ids=source if copied else None)  # fmt: skip
        ids, _ = beam_search(step, np.full((1,), 1), [np.zeros((1, 1))], beam_size=2, alpha=0.3,
                             max_length=words + 300, eos_id=vocabulary.eos_id)  # fmt: skip
        return keras.ops.convert_to_numpy(ids)[0, 0, : len(gold)].tolist()

    assert search(gold) == gold
    if copied:
        is_word = [t not in vocabulary.ids or not vocabulary.is_tree_token(t) for t in linearize(GOLD_2, words=True)]
        misled = [wrong_word if w else i for i, w in zip(gold, is_word + [False])]
        assert misled != gold
        assert search(misled) == gold


def test_vocabulary_saves_and_loads_with_its_form_of_words(vocabulary, tmp_path):
    path = tmp_path / "vocabulary.json"
    vocabulary.save(path)
    loaded = ParsingVocabulary.load(path)
    assert loaded.tokens == vocabulary.tokens and loaded.target_words == vocabulary.target_words
    path.write_text("<pad>\n<s>\n</s>\n")
    with pytest.raises(ValueError, match="is not a saved parsing vocabulary"):
        ParsingVocabulary.load(path)
    with pytest.raises(ValueError, match=r"target_words must be one of \['XX', 'copied'\]. Received: 'words'"):
        ParsingVocabulary(vocabulary.tokens, target_words="words")


def test_parser_refuses_bad_sentences_and_settings(vocabulary):
    model = kt.build_transformer("tiny", vocabulary_size=len(vocabulary), num_layers=1)
    parser = Parser(model, vocabulary, beam_size=1)
    for bad in ([], ["two words"], [""]):
        with pytest.raises(ValueError, match=r"sentences\[0\] must be a non-empty list of words"):
            parser.parse([bad])
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1. Received: beam_size=0"):
        Parser(model, vocabulary, beam_size=0)
    with pytest.raises(ValueError, match=f"The vocabulary has {len(vocabulary)} tokens, the model 99"):
        Parser(kt.build_transformer("tiny", vocabulary_size=99, num_layers=1), vocabulary)


@needs_ptb_sample
@in_one_pass("jax", "reading and linearizing trees is Python")
def test_every_sample_tree_linearizes_and_reads_back():
    paths = sorted(os.path.join(PTB_SAMPLE, name) for name in os.listdir(PTB_SAMPLE) if name.endswith(".mrg"))
    trees = [clean(tree) for tree in read_treebank(paths)]
    assert len(trees) == 3914 and all(tree is not None for tree in trees)
    for tree in trees:
        assert delinearize(linearize(tree), tree.words(), tree.tags()) == tree
        assert bracket_scores([tree], [tree])["f1"] == 100.0

"""Labelled bracket precision, recall and F1, as EVALB scores them.

The definition is EVALB's (Sekine and Collins, 1997) with its `COLLINS.prm`
settings, which parsing papers, section 6.3 of the Transformer paper
included, report:

- A bracket is a constituent's (label, first word, last word). Part-of-speech
  tags are not brackets, and neither is the root of an unlabelled `TOP`.
- Words tagged as punctuation (`,` `:` `` ` `` `''` `.`) are taken out of
  the sentence before spans are counted, in both trees, by the gold tags; a
  constituent left with no words is not a bracket.
- `ADVP` and `PRT` are the same label.
- Brackets match one to one, as multisets: a bracket that occurs twice
  (the unary chain `(NP (NP ...))`) matches at most twice.
- Precision is matched / test brackets and recall matched / gold brackets,
  summed over the corpus (micro-averaged); F1 is their harmonic mean.

Function tags and empty elements are expected to be gone (see
`treebank.clean`).
"""

import collections

PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
EQUIVALENT_LABELS = {"PRT": "ADVP"}


def brackets(tree, gold_tags=None, labelled=True):
    """The multiset of brackets of `tree`, as a `Counter` of
    (label, first, last) over the non-punctuation words.

    Args:
        tree: a `Tree`.
        gold_tags: the tags that decide punctuation (the gold tree's);
            `tree`'s own when None.
        labelled: False replaces every label by the same one (unlabelled
            F1).
    """
    tags = gold_tags if gold_tags is not None else tree.tags()
    if len(tags) != len(tree.words()):
        raise ValueError(
            f"Expected one gold tag per word: {len(tags)} tags for {len(tree.words())} words."
        )
    kept = [tag not in PUNCTUATION_TAGS for tag in tags]
    found = collections.Counter()

    def visit(node, start):
        """Adds node's brackets; returns the index after its last word."""
        if node.is_preterminal:
            return start + 1
        end = start
        for child in node.children:
            end = visit(child, end)
        words = sum(kept[start:end])
        if words and node.label not in ("", "TOP"):
            first = sum(kept[:start])
            label = EQUIVALENT_LABELS.get(node.label, node.label) if labelled else "*"
            found[(label, first, first + words - 1)] += 1
        return end

    visit(tree, 0)
    return found


def bracket_scores(gold_trees, test_trees, labelled=True):
    """EVALB's corpus-level bracket scores of `test_trees` against `gold_trees`.

    Returns:
        A dict: `precision`, `recall`, `f1` (percentages), `matched`,
        `gold_brackets`, `test_brackets`, `sentences`, and `exact` (the
        percentage of sentences whose brackets all match).

    Raises:
        ValueError: if the lists differ in length, or a test tree's words
            differ from its gold tree's.
    """
    if len(gold_trees) != len(test_trees):
        raise ValueError(
            f"Expected one test tree per gold tree. Received {len(gold_trees)} gold and {len(test_trees)} test trees."
        )
    matched = gold_total = test_total = exact = 0
    for index, (gold, test) in enumerate(zip(gold_trees, test_trees)):
        if gold.words() != test.words():
            raise ValueError(
                f"Sentence {index}: the test tree's words differ from the gold tree's "
                f"({len(test.words())} against {len(gold.words())} words)."
            )
        gold_brackets = brackets(gold, labelled=labelled)
        test_brackets = brackets(test, gold.tags(), labelled=labelled)
        common = sum((gold_brackets & test_brackets).values())
        matched += common
        gold_total += sum(gold_brackets.values())
        test_total += sum(test_brackets.values())
        exact += gold_brackets == test_brackets
    precision = 100.0 * matched / test_total if test_total else 0.0
    recall = 100.0 * matched / gold_total if gold_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "matched": matched,
        "gold_brackets": gold_total,
        "test_brackets": test_total,
        "sentences": len(gold_trees),
        "exact": 100.0 * exact / len(gold_trees) if gold_trees else 0.0,
    }

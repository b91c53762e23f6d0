"""Trees as token sequences and back (section 6.3, after Vinyals et al. 2015).

A tree is written depth-first: `(NP` opens a constituent, `)` closes the
innermost open one, and `XX` stands for each word with its part-of-speech
tag, which the parser does not predict:

    (S (NP (DT the) (NN dog)) (VP (VBZ barks)))
    ->  (S (NP XX XX ) (VP XX ) )

or, with `words=True`, each word is written itself:

    ->  (S (NP the dog ) (VP barks ) )

so that the decoder reads which word it has reached instead of counting
`XX`s; the parser then writes the sentence's next word where the other
form has `XX` (`ParsingVocabulary(target_words="copied")`). Either way the
words come back from the sentence, in order, when the sequence is read
back into a tree.
"""

import collections
import json

from keras_transformer.files import write_atomically
from keras_transformer.parsing.treebank import Tree

WORD = "XX"
CLOSE = ")"
OPEN_PREFIX = "("


def linearize(tree, words=False):
    """The token sequence of `tree` (a cleaned tree; see `treebank.clean`),
    with `XX` for each word, or the word itself if `words`."""
    if tree.is_preterminal:
        return [tree.children[0] if words else WORD]
    tokens = [OPEN_PREFIX + tree.label]
    for child in tree.children:
        tokens.extend(linearize(child, words))
    tokens.append(CLOSE)
    return tokens


def delinearize(tokens, words, tags=None):
    """The tree that `tokens` describe over `words`.

    Args:
        tokens: a sequence from `linearize` (or a parser).
        words: the sentence; one per `XX`.
        tags: the part-of-speech tag of each word (the gold tags, for
            scoring: EVALB reads punctuation from them); `XX` if None.

    Returns:
        A `Tree`.

    Raises:
        ValueError: if `tokens` is not one well-formed tree over exactly
            `len(words)` words: unbalanced brackets, an empty constituent, a
            word outside the root, or too few or too many words.
    """
    tags = tags if tags is not None else [WORD] * len(words)
    if len(tags) != len(words):
        raise ValueError(f"Expected one tag per word. Received {len(words)} words and {len(tags)} tags.")
    stack, root, used = [], None, 0

    def fail(why, position):
        raise ValueError(f"Not a tree: {why} at token {position} of {' '.join(tokens)!r}.")

    for position, token in enumerate(tokens):
        if root is not None:
            fail("a token after the root closed", position)
        if token.startswith(OPEN_PREFIX) and len(token) > 1:
            stack.append(Tree(token[1:], []))
        elif token == CLOSE:
            if not stack:
                fail("')' closes nothing", position)
            node = stack.pop()
            if not node.children:
                fail(f"an empty constituent ({node.label})", position)
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
        elif token == WORD:
            if not stack:
                fail("a word outside the root", position)
            if used == len(words):
                fail(f"more words than the sentence's {len(words)}", position)
            stack[-1].children.append(Tree(tags[used], [words[used]]))
            used += 1
        else:
            fail(f"the unknown token {token!r}", position)
    if root is None:
        fail("brackets left open" if stack else "no tree", len(tokens))
    if used != len(words):
        fail(f"{used} words where the sentence has {len(words)}", len(tokens))
    return root


def right_branching(words, tags, root_label="S", label="NP"):
    """The right-branching tree over `words`, a baseline parser: the root
    over all words, then a constituent over words i.. for each i >= 1,
    down to the last two. Labelled `root_label` at the root and `label`
    below (a baseline takes the treebank's most frequent labels)."""
    node = Tree(tags[-1], [words[-1]])
    if len(words) == 1:
        return Tree(root_label, [node])
    for i in range(len(words) - 2, -1, -1):
        node = Tree(label if i > 0 else root_label, [Tree(tags[i], [words[i]]), node])
    return node


class ParsingVocabulary:
    """One vocabulary for the sentence's words and the tree's tokens.

    Ids 0-2 are padding, BOS and EOS, as in the translation vocabulary.
    Then come the unknown-word classes, `XX`, `)`, one `(label` per
    constituent label of the training trees, and the training words seen at
    least `min_count` times. A word outside it is read as the class of its
    shape: capitalized, with a digit, with a hyphen, or other.

    Args:
        tokens: the vocabulary, in id order (see `build`).
        target_words: how trees write their words: `"XX"` for each (Vinyals
            et al., 2015), or `"copied"`, each word's own id, the same as in
            the sentence.
    """

    SPECIAL = ("<pad>", "<s>", "</s>")
    UNKNOWN = ("<unk>", "<unk-cap>", "<unk-num>", "<unk-hyphen>")
    TARGET_WORDS = ("XX", "copied")
    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, tokens, target_words="XX"):
        tokens = list(tokens)
        if tuple(tokens[:3]) != self.SPECIAL or len(set(tokens)) != len(tokens):
            raise ValueError(
                f"A parsing vocabulary starts with {list(self.SPECIAL)} and has no duplicates. "
                f"Received {len(tokens)} tokens starting {tokens[:3]}."
            )
        if target_words not in self.TARGET_WORDS:
            raise ValueError(f"target_words must be one of {list(self.TARGET_WORDS)}. Received: {target_words!r}")
        self.tokens = tokens
        self.target_words = target_words
        self.ids = {token: i for i, token in enumerate(tokens)}

    @classmethod
    def build(cls, trees, min_count=2, target_words="XX"):
        """From training trees: their labels, and their words seen at least
        `min_count` times."""
        labels, counts = set(), collections.Counter()
        for tree in trees:
            labels.update(t[1:] for t in linearize(tree) if t.startswith(OPEN_PREFIX))
            counts.update(tree.words())
        words = sorted(w for w, c in counts.items() if c >= min_count)
        tree_tokens = [WORD, CLOSE] + [OPEN_PREFIX + label for label in sorted(labels)]
        tokens = list(cls.SPECIAL) + list(cls.UNKNOWN) + tree_tokens + [w for w in words if w not in tree_tokens]
        return cls(tokens, target_words)

    def __len__(self):
        return len(self.tokens)

    def word_id(self, word):
        if word in self.ids and not self.is_tree_token(word):
            return self.ids[word]
        if word[:1].isupper():
            return self.ids["<unk-cap>"]
        if any(c.isdigit() for c in word):
            return self.ids["<unk-num>"]
        if "-" in word:
            return self.ids["<unk-hyphen>"]
        return self.ids["<unk>"]

    @staticmethod
    def is_tree_token(token):
        return token in (WORD, CLOSE) or (token.startswith(OPEN_PREFIX) and len(token) > 1)

    def encode_sentence(self, words):
        """Source ids: the words, then EOS."""
        return [self.word_id(word) for word in words] + [self.eos_id]

    def encode_tree(self, tree):
        """Target ids: the linearized tree (EOS is added by the batching)."""
        copied = self.target_words == "copied"
        tokens = linearize(tree, words=copied)
        unknown = [t for t in tokens if self.is_tree_token(t) and t not in self.ids]
        if unknown:
            raise ValueError(
                f"The tree has labels the vocabulary lacks: {sorted(set(unknown))}. "
                "Build the vocabulary from trees that have them."
            )
        return [self.ids[t] if self.is_tree_token(t) else self.word_id(t) for t in tokens]

    def decode(self, ids):
        """Tree tokens of `ids`, up to the first EOS, with `XX` for each
        word (the sentence gives it back; see `delinearize`)."""
        tokens = []
        for i in ids:
            if int(i) in (self.eos_id, self.pad_id):
                break
            token = self.tokens[int(i)]
            tokens.append(token if self.is_tree_token(token) else WORD)
        return tokens

    def token_classes(self):
        """Per id: (opens a constituent, closes one, is a word, is EOS), as
        lists of bools, for the decoder's well-formedness constraint. With
        copied words, every id that is not special or a tree token is a
        word."""
        opens = [t.startswith(OPEN_PREFIX) and len(t) > 1 for t in self.tokens]
        closes = [t == CLOSE for t in self.tokens]
        if self.target_words == "copied":
            words = [i >= len(self.SPECIAL) and not self.is_tree_token(t) for i, t in enumerate(self.tokens)]
        else:
            words = [t == WORD for t in self.tokens]
        eos = [i == self.eos_id for i in range(len(self.tokens))]
        return opens, closes, words, eos

    def save(self, path):
        """A JSON file: the tokens in id order, and `target_words`."""
        saved = {"target_words": self.target_words, "tokens": self.tokens}
        write_atomically(path, json.dumps(saved, ensure_ascii=False, indent=0))

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as file:
            try:
                saved = json.load(file)
                return cls(saved["tokens"], saved["target_words"])
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{path} is not a saved parsing vocabulary: expected a JSON object with "
                    f'"tokens" and "target_words" ({error}).'
                ) from None

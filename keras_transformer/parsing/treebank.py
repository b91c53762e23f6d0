"""Penn Treebank trees: reading the bracketed `.mrg` format, and the usual
clean-up before parsing experiments (section 6.3 of the paper)."""

import collections
import os
import re

# Empty elements (traces, null subjects): not words of the sentence.
EMPTY_TAG = "-NONE-"
# What follows a label's first "-" or "=": function tags and co-indices.
_FUNCTION_TAGS = re.compile(r"[-=].*$")


class Tree:
    """A constituency tree: a label and its children.

    A preterminal (a part-of-speech tag over a word) has the word, a
    string, as its only child; every other node has trees as children.

    Args:
        label: the constituent label (`"NP"`) or part-of-speech tag (`"NN"`).
        children: a list of `Tree`s, or `[word]` for a preterminal.
    """

    def __init__(self, label, children):
        self.label = label
        self.children = list(children)

    @property
    def is_preterminal(self):
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def preterminals(self):
        """The (tag, word) pairs of the sentence, left to right."""
        if self.is_preterminal:
            return [(self.label, self.children[0])]
        return [pair for child in self.children for pair in child.preterminals()]

    def words(self):
        return [word for _, word in self.preterminals()]

    def tags(self):
        return [tag for tag, _ in self.preterminals()]

    def __eq__(self, other):
        return isinstance(other, Tree) and (self.label, self.children) == (other.label, other.children)

    def __repr__(self):
        return f"Tree.from_string({str(self)!r})"

    def __str__(self):
        if self.is_preterminal:
            return f"({self.label} {self.children[0]})"
        return f"({self.label} " + " ".join(str(child) for child in self.children) + ")"

    @classmethod
    def from_string(cls, text, where="<string>"):
        """Reads one bracketed tree, such as `(S (NP (DT the) (NN dog)) (VP (VBZ barks)))`."""
        trees = list(_read_trees(text, where))
        if len(trees) != 1:
            raise ValueError(f"{where}: expected one tree, found {len(trees)}.")
        return trees[0]


def _tokens(text):
    # Words and labels never hold spaces or brackets in the treebank.
    for match in re.finditer(r"\(|\)|[^\s()]+", text):
        yield match.group(), match.start()


def _line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def _read_trees(text, where):
    """Every top-level tree of `text`; a malformed bracket is an error that
    names the line."""
    stack = []  # open nodes: [label, children, offset]
    tokens = list(_tokens(text))
    index = 0
    while index < len(tokens):
        token, offset = tokens[index]
        if token == "(":
            label = ""
            if index + 1 < len(tokens) and tokens[index + 1][0] not in "()":
                label = tokens[index + 1][0]
                index += 1
            stack.append([label, [], offset])
        elif token == ")":
            if not stack:
                raise ValueError(f"{where}, line {_line_of(text, offset)}: ')' closes nothing.")
            label, children, start = stack.pop()
            if not children:
                raise ValueError(f"{where}, line {_line_of(text, start)}: an empty constituent ({label}).")
            node = Tree(label, children)
            if stack:
                stack[-1][1].append(node)
            else:
                yield node
        else:
            if not stack:
                raise ValueError(
                    f"{where}, line {_line_of(text, offset)}: {token!r} outside any bracket."
                )
            children = stack[-1][1]
            if children:
                raise ValueError(
                    f"{where}, line {_line_of(text, offset)}: the word {token!r} follows "
                    "other children; a word must be the only child of its tag."
                )
            children.append(token)
        index += 1
    if stack:
        raise ValueError(
            f"{where}, line {_line_of(text, stack[-1][2])}: {len(stack)} bracket(s) left open at the end."
        )


def read_treebank(paths):
    """The trees of treebank files, in file order, as in `wsj_0001.mrg`.

    Each file holds trees wrapped in an unlabelled root: `( (S ...) )`.

    Args:
        paths: `.mrg` file paths.

    Returns:
        A list of `Tree`s, as written (see `clean` for the usual clean-up).
    """
    trees = []
    for path in paths:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        found = list(_read_trees(text, os.fspath(path)))
        if not found:
            raise ValueError(f"{path}: no tree found; expected bracketed trees such as ( (S ...) ).")
        trees.extend(found)
    return trees


def strip_function_tags(label):
    """`"NP-SBJ-1"` -> `"NP"`, `"PP-LOC=2"` -> `"PP"`; `"-NONE-"` stays."""
    if label.startswith("-"):
        return label
    return _FUNCTION_TAGS.sub("", label)


def clean(tree):
    """The tree parsers learn and are scored on: no empty elements, no
    function tags or indices, no unlabelled root.

    Empty elements (`-NONE-`) are removed, with the constituents that held
    nothing else; function tags and co-indices are stripped from
    constituent labels (part-of-speech tags are kept as they are); the
    treebank's unlabelled root is dropped when it has one child.

    Returns:
        A new `Tree`, or None if nothing but empty elements was left.
    """

    def cleaned(node):
        if node.is_preterminal:
            return None if node.label == EMPTY_TAG else Tree(node.label, node.children)
        children = [c for c in (cleaned(child) for child in node.children) if c is not None]
        if not children:
            return None
        return Tree(strip_function_tags(node.label), children)

    result = cleaned(tree)
    while result is not None and result.label == "" and len(result.children) == 1:
        result = result.children[0]
    return result


def label_counts(trees):
    """How often each constituent label occurs (preterminals not counted)."""
    counts = collections.Counter()

    def count(node):
        if not node.is_preterminal:
            counts[node.label] += 1
            for child in node.children:
                count(child)

    for tree in trees:
        count(tree)
    return counts

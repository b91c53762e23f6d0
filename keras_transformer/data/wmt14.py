"""The paper's WMT14 data (English-German, English-French), from TFDS or
from local files."""

import os

from keras_transformer.data.corpus import concatenate
from keras_transformer.data.corpus import read_parallel_text
from keras_transformer.data.corpus import read_tfds
from keras_transformer.files import write_atomically

# With no train.en/train.de, the WMT news test sets make a small offline
# setup: the older sets train, newstest2013 validates (the paper's
# development set) and newstest2014 tests (the paper's test set).
OFFLINE_SPLITS = {
    "train": [
        "newstest2008",
        "newstest2009",
        "newstest2010",
        "newstest2011",
        "newstest2012",
        "newssyscomb2009",
    ],
    "valid": ["newstest2013"],
    "test": ["newstest2014"],
}
STANDARD_SPLITS = {"train": ["train"], "valid": ["valid"], "test": ["test"]}


def tfds_name(source_language, target_language):
    """The TFDS dataset of a pair: `wmt14_translate/de-en` for en-de or de-en,
    `wmt14_translate/fr-en` for en-fr; TFDS names the pair other-English."""
    other = {source_language, target_language} - {"en"}
    if len(other) != 1 or source_language == target_language:
        raise ValueError(
            "WMT14 pairs English with one other language. Received: "
            f"source_language={source_language!r}, target_language={target_language!r}"
        )
    return f"wmt14_translate/{other.pop()}-en"


def read_wmt14(data_dir=None, max_length=None, source_language="en", target_language="de"):
    """Train, validation and test corpora for a WMT14 pair (English-German
    by default).

    With `data_dir`, reads `{train,valid,test}.{en,de}` (each maybe `.gz`)
    from it; or, when it has no `train.en`, the WMT news test sets
    (newstest2008-2012 and newssyscomb2009 to train, newstest2013 to
    validate, newstest2014 to test), as statmt.org names them. Without
    `data_dir`, reads TFDS `wmt14_translate/<other>-en` (train, validation,
    test), such as `de-en` or `fr-en`.

    Args:
        data_dir: a folder of parallel text files, or None for TFDS.
        max_length: drop training pairs with a side longer than this many
            words. Validation and test sets are kept whole.
        source_language: the source file suffix.
        target_language: the target file suffix.

    Returns:
        A dict of `ParallelCorpus`: `"train"`, `"valid"`, `"test"`.
    """
    if data_dir is None:
        return {
            split: read_tfds(
                name=tfds_name(source_language, target_language),
                split=tfds_split,
                source_language=source_language,
                target_language=target_language,
                max_length=max_length if split == "train" else None,
            )
            for split, tfds_split in (
                ("train", "train"),
                ("valid", "validation"),
                ("test", "test"),
            )
        }

    splits = wmt14_files(data_dir, source_language, target_language)
    return {
        split: concatenate(
            [
                read_parallel_text(
                    source, target, max_length=max_length if split == "train" else None
                )
                for source, target in pairs
            ],
            name=f"{data_dir}:{split}",
        )
        for split, pairs in splits.items()
    }


def wmt14_files(data_dir, source_language="en", target_language="de"):
    """The parallel files of each split in `data_dir`, as `read_wmt14` reads them.

    Returns:
        A dict from `"train"`, `"valid"` and `"test"` to lists of
        (source path, target path).
    """

    def find(stem, language):
        for name in (f"{stem}.{language}", f"{stem}.{language}.gz"):
            if os.path.isfile(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        return None

    layout = STANDARD_SPLITS if find("train", source_language) else OFFLINE_SPLITS
    missing = [
        f"{stem}.{language}[.gz]"
        for stems in layout.values()
        for stem in stems
        for language in (source_language, target_language)
        if find(stem, language) is None
    ]
    if missing:
        raise FileNotFoundError(
            f"{data_dir} lacks WMT14 files. Looked for either "
            f"{{train,valid,test}}.{{{source_language},{target_language}}} or the news "
            f"test sets {', '.join(sum(OFFLINE_SPLITS.values(), []))} (each "
            f".{source_language} and .{target_language}, maybe .gz). Missing: "
            + ", ".join(missing)
        )
    return {
        split: [(find(stem, source_language), find(stem, target_language)) for stem in stems]
        for split, stems in layout.items()
    }


def write_tfds_files(directory, source_language="en", target_language="de"):
    """Writes TFDS `wmt14_translate/<other>-en` as `{train,valid,test}.{source,target}`.

    Training then reads plain files, as from any other source, and a run
    can be resumed from its configuration alone. Splits already written
    are kept. Needs tensorflow-datasets and, the first time, the network.

    Returns:
        `directory`, which `wmt14_files` reads.
    """
    os.makedirs(directory, exist_ok=True)
    for split, tfds_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        paths = [os.path.join(directory, f"{split}.{lang}") for lang in (source_language, target_language)]
        if all(os.path.isfile(path) for path in paths):
            continue
        corpus = read_tfds(
            name=tfds_name(source_language, target_language),
            split=tfds_split,
            source_language=source_language,
            target_language=target_language,
        )
        for path, lines in zip(paths, (corpus.sources, corpus.targets)):
            write_atomically(path, "".join(line.replace("\n", " ") + "\n" for line in lines))
    return directory

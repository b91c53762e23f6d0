"""The log-probability a translator gives a translation it is handed, as
fairseq's `--score-reference`, CTranslate2's `score_batch` and
`marian-scorer` give it: the target teacher-forced through the model in one
pass, and each token's log softmax at that token, summed.

The tokens scored are the target's pieces and EOS. Tokens the translator
forces (its target prefix, such as a converted NLLB-200's target language)
count 0, as in the searches: so greedy search's score of the translation it
found (log P) is the score `Translator.score` gives it, and beam
search's is it divided by the length penalty (`beam_search.length_penalty`).
"""

import dataclasses

from keras import ops

from keras_transformer.data.batches import bucket_lengths
from keras_transformer.data.batches import padded_ids
from keras_transformer.data.sentences import check_texts
from keras_transformer.decoding.compiled import CompiledFunction
from keras_transformer.decoding.streaming import split_pair
from keras_transformer.models.config import POSITION_TABLES


@dataclasses.dataclass(frozen=True)
class Score:
    """A translation's log-probability given its source.

    Attributes:
        log_probability: the sum over the tokens scored (natural log).
        tokens: how many tokens were scored: the pieces and EOS.
        token_log_probabilities: each scored token's, in order (EOS last),
            where asked for; else None.
    """

    log_probability: float
    tokens: int
    token_log_probabilities: list = None

    @property
    def mean(self):
        """The log-probability per token scored, as fairseq's `--score-reference` reports it."""
        return self.log_probability / self.tokens


def token_log_probabilities(model, source_ids, target_ids, bos_id, forced_length=0):
    """log P(target_ids[:, t] | source, target_ids[:, :t]) at every position.

    Args:
        model: a `Transformer`.
        source_ids: int `[B, S]`, each source followed by EOS, then 0s.
        target_ids: int `[B, T]`, each target's forced tokens, pieces and
            EOS, then 0s.
        bos_id: the decoder's first input.
        forced_length: the forced tokens at the start of every target,
            which count 0.

    Returns:
        float32 `[B, T]`, 0 at padding and at forced positions.
    """
    batch = ops.shape(target_ids)[0]
    inputs = ops.concatenate(
        [ops.full((batch, 1), bos_id, dtype="int32"), target_ids[:, :-1]], axis=1
    )  # the decoder reads each token before the one it predicts
    # The model's own call: every position in one pass, without dropout.
    logits = ops.cast(model({"source_ids": source_ids, "target_ids": inputs}, training=False), "float32")
    chosen = ops.take_along_axis(logits, ops.expand_dims(target_ids, -1), axis=-1)[..., 0]
    log_probs = chosen - ops.logsumexp(logits, axis=-1)
    positions = ops.arange(ops.shape(target_ids)[1], dtype="int32")
    scored = ops.logical_and(ops.not_equal(target_ids, 0), ops.greater_equal(positions, forced_length)[None, :])
    return ops.where(scored, log_probs, 0.0)


def score_texts(translator, sources, targets, token_scores=False, first_line=0):
    """`Translator.score`: a `Score` of each target given its source."""
    sources, targets = check_texts(sources), check_texts(targets)
    if len(sources) != len(targets):
        raise ValueError(
            f"score takes one target per source. Received {len(sources)} sources and {len(targets)} targets."
        )
    for i, (source, target) in enumerate(zip(sources, targets)):
        if not source.strip() or not target.strip():
            side = "source" if not source.strip() else "target"
            raise ValueError(
                f"Line {first_line + i + 1} has a blank {side}; a pair is scored with both sides. "
                f"Received: {source[:50]!r} -> {target[:50]!r}"
            )
    if not sources:
        return []
    eos = translator.tokenizer.eos_id
    pairs = dict(enumerate(zip(
        [ids + [eos] for ids in translator.tokenizer.tokenize(sources)],
        [ids + [eos] for ids in translator.tokenizer.tokenize_target(targets)],
    )))
    prefix, limit = list(translator.target_prefix or []), target_limit(translator)
    for i, (source_ids, target_ids) in pairs.items():
        where = f"Line {first_line + i + 1}"
        if len(source_ids) > translator.max_source_length:
            raise ValueError(
                f"{where} has a source of {len(source_ids)} subword tokens (EOS included), more than "
                f"max_source_length={translator.max_source_length}: a cut source would not be scored as itself. "
                f"Expected at most {translator.max_source_length}."
            )
        if len(target_ids) > limit:
            raise ValueError(
                f"{where} has a target of {len(target_ids)} tokens (EOS included), more than this translator "
                f"outputs (max_source_length + max_extra_length, within the model's positions). Expected at most {limit}."
            )
        if target_ids[: len(prefix)] != prefix:
            raise ValueError(
                f"{where}: the target's tokens must begin with the translator's target prefix {prefix}, "
                f"which its outputs begin with. Received: {target_ids[: len(prefix)]}"
            )
    found = score_ids(translator, pairs, len(prefix), token_scores)
    return [found[i] for i in range(len(sources))]


def target_limit(translator):
    """The most target tokens scored: the most an output of `translator` has."""
    limit = translator.max_source_length + translator.max_extra_length
    if translator.model.position_encoding in POSITION_TABLES:
        limit = min(limit, translator.model.max_length)
    return limit


def score_ids(translator, pairs, forced_length, token_scores):
    """A `Score` per `(source_ids, target_ids)` of `pairs` (a dict), in
    batches of similar lengths, padded as the searches' to few shapes."""
    target_lengths = bucket_lengths(target_limit(translator), step=1.5)
    scorer = compiled_scorer(translator, forced_length)
    order = sorted(pairs, key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    results = {}
    for start in range(0, len(order), translator.batch_size):
        rows = order[start : start + translator.batch_size]
        chosen = [pairs[i] for i in rows] + [pairs[rows[-1]]] * (translator.rows_for(len(rows)) - len(rows))
        source_ids = padded_ids([s for s, _ in chosen], translator.source_lengths)
        target_ids = padded_ids([t for _, t in chosen], target_lengths)
        log_probs = scorer(source_ids, target_ids)
        for row, i in enumerate(rows):
            values = log_probs[row, forced_length : len(pairs[i][1])]
            results[i] = Score(float(values.sum()), len(values), values.tolist() if token_scores else None)
    return results


def compiled_scorer(translator, forced_length):
    """`token_log_probabilities` of `translator`'s model, compiled as its
    searches are (`CompiledFunction`), made once per translator and forced length."""
    key = ("scorer", forced_length)
    if key not in translator.derived:
        model, bos_id = translator.model, translator.tokenizer.bos_id
        translator.derived[key] = CompiledFunction(
            lambda source_ids, target_ids, decoding=None: token_log_probabilities(
                model, source_ids, target_ids, bos_id, forced_length
            ),
            model, input_ranks=(2, 2), jit_compile=translator.jit_compile, trace_loops=False,
        )
    return translator.derived[key]


class ScoredLines:
    """`streaming.translate_file`'s translator for the `score` command: a
    line of scores for each pair of a `streaming.PairedLines` window."""

    def __init__(self, translator, token_scores=False):
        self.translator = translator
        self.token_scores = token_scores

    def translate(self, texts, first_line=0):
        pairs = [split_pair(text) for text in texts]
        scores = self.translator.score([s for s, _ in pairs], [t for _, t in pairs], self.token_scores, first_line)
        return [score_line(score) for score in scores]


def score_line(score):
    """`LOG_PROBABILITY<TAB>MEAN`, then `<TAB>` and each token's, spaced,
    where they were asked for."""
    line = f"{score.log_probability:.6f}\t{score.mean:.6f}"
    if score.token_log_probabilities is not None:
        line += "\t" + " ".join(f"{value:.6f}" for value in score.token_log_probabilities)
    return line

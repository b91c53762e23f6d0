"""Corpus BLEU and chrF with sacreBLEU, on detokenized text as it is."""

import sacrebleu.metrics


def score_translations(hypotheses, references):
    """sacreBLEU's BLEU (13a, cased) and chrF2 of `hypotheses`.

    Returns:
        A dict: `bleu`, `chrf` and `bp` (rounded), `bleu_text` (sacreBLEU's
        own line), and the metrics' signatures, which say how to reproduce
        the figures.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            "Scoring needs one reference per translation. Received: "
            f"{len(hypotheses)} translations and {len(references)} references"
        )
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bp": round(bleu_score.bp, 3),
        "bleu_text": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def tune_search(translator, sources, references, alphas, beam_sizes=None, log=None):
    """BLEU of `translator`'s search on held-out pairs at each beam size and
    length penalty, as section 6.1 chose its beam size and alpha "after
    experimentation on the development set". Never tune on a test set.

    Args:
        translator: a `Translator`; its model and other settings are kept.
        sources, references: the held-out pairs, aligned lists of strings.
        alphas: the length penalty exponents to try.
        beam_sizes: the beam sizes to try (default: the translator's); beam
            1, greedy search, at the first alpha only.
        log: called with a line for each setting as it is scored.

    Returns:
        `(best, results)`: `results` holds one dict per setting, in the
        order tried (`beam_size`, `alpha`, `bleu`, `chrf`, `bp`, `seconds`);
        `best` is the one of highest BLEU, the first tried among equals.
    """
    import time

    if not sources:
        raise ValueError("Tuning needs held-out pairs. Received: no sources.")
    if not alphas:
        raise ValueError("Tuning needs at least one alpha. Received: alphas=[]")
    beam_sizes = [translator.beam_size] if beam_sizes is None else list(beam_sizes)
    if not beam_sizes:
        raise ValueError("Tuning needs at least one beam size. Received: beam_sizes=[]")
    if len(sources) != len(references):
        raise ValueError(
            "Tuning needs one reference per source. Received: "
            f"{len(sources)} sources and {len(references)} references"
        )
    # Every setting is checked before any is decoded; greedy search (beam
    # 1) has no length penalty, so it is decoded once.
    searches = [
        (beam_size, alpha, translator.with_search(beam_size=beam_size, alpha=alpha))
        for beam_size in beam_sizes
        for alpha in (alphas if beam_size != 1 else alphas[:1])
    ]
    results = []
    for beam_size, alpha, search in searches:
        start = time.perf_counter()
        hypotheses = search.translate(list(sources))
        seconds = time.perf_counter() - start
        scores = score_translations(hypotheses, references)
        result = {"beam_size": beam_size, "alpha": search.alpha, "seconds": round(seconds, 1)}
        result |= {name: scores[name] for name in ("bleu", "chrf", "bp")}
        results.append(result)
        if log is not None:
            log(
                f"beam {beam_size}, alpha {search.alpha}: BLEU {result['bleu']:.2f}, "
                f"chrF {result['chrf']:.2f}, BP {result['bp']:.3f} ({seconds:.0f} s)"
            )
    best = max(results, key=lambda result: result["bleu"])  # the first of equals
    return best, results

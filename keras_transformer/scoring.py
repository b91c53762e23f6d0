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

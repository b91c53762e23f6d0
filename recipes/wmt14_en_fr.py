"""The paper's WMT14 English-to-French setup (section 6.1).

    python recipes/wmt14_en_fr.py --model-dir runs/wmt14-en-fr-big      # TFDS, big model
    python recipes/wmt14_en_fr.py --data-dir DIR --model-dir runs/en-fr  # {train,valid,test}.{en,fr}
    python recipes/wmt14_en_fr.py --data-dir DIR --model-dir runs/smoke --smoke

The same recipe code as `recipes/wmt14_en_de.py` (and `keras-transformer
train`), with section 6.1's English-French settings as defaults: the big
model (6+6 layers, d_model 1024, 16 heads) with P_drop 0.1 instead of 0.3,
a shared vocabulary of 32,000 subword pieces (the paper's word pieces; ours
are SentencePiece BPE), and the average of the last 20 checkpoints. As for
English-German: token-based batches, Adam on the warmup/rsqrt schedule,
label smoothing 0.1, beam 4 with alpha 0.6, at most source length + 50
output tokens, and sacreBLEU on newstest2014 (the test split). Without
--data-dir, TFDS `wmt14_translate/fr-en` (36M pairs) is written once as
text files under `<model-dir>/data/`. The paper trained the big model for
300,000 steps on 8 P100 GPUs (3.5 days) and reports 41.8 BLEU; this
recipe trains 100,000 steps unless given --train-steps 300000.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wmt14_en_de  # noqa: E402  (the recipe code, and the quiet-logs setup)

EN_FR = {"preset": "big", "vocabulary_size": 32000, "dropout": 0.1, "average": 20}


if __name__ == "__main__":
    wmt14_en_de.main(source_language="en", target_language="fr", defaults=EN_FR, description=__doc__)

"""orchestrator/progress.py: what the driver's bar shows."""

import io

from orchestrator.progress import Progress
from trainers.link import metrics as M


def _postfix(records):
    p = Progress(total=1000, enabled=True)
    p.bar.fp = io.StringIO()  # keep the test's output clean
    p.update(records)
    text = p.bar.postfix
    p.close()
    return text


def test_a_classifier_shows_validation_accuracy():
    text = _postfix([(10, {M.TRAIN_LOSS: 0.5, M.SAMPLES_SEEN: 320, M.VAL_ACCURACY: 0.91, M.VAL_LOSS: 0.3})])
    assert "step=10" in text and "val_acc=0.910" in text and "val_ppl" not in text


def test_a_language_model_shows_validation_perplexity_not_token_accuracy():
    text = _postfix([(10, {M.TRAIN_LOSS: 1.5, M.SAMPLES_SEEN: 320, M.VAL_ACCURACY: 0.55,
                           M.VAL_PERPLEXITY: 4.4817})])
    assert "val_ppl=4.48" in text and "val_acc" not in text

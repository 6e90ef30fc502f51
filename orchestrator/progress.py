"""The driver's progress bar (tqdm on stderr).

It counts training samples, not steps: the total (``train.epochs`` x the training set) is known
before the run and stays right when the batch grows (a step count at the initial batch would end
far short of its total).  The postfix shows the step, epoch, loss, the batch the policy has in
force (``B``), the workers actually training (``W``) and the latest validation accuracy (perplexity,
for a language model).
"""

from __future__ import annotations

import math
import sys

from orchestrator.config import RootConfig
from trainers.link import metrics as M
from trainers.link.messages import Record


def total_samples(cfg: RootConfig, functions: dict | None = None) -> int:
    """Samples a run of ``train.epochs`` trains on (the bar's total)."""
    from trainers.workload.build import train_size

    return math.ceil(cfg.train.epochs * train_size(cfg, functions))


class Progress:
    """A tqdm bar on the driver: samples trained of the run's total, with step, epoch, loss, B, W."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="sample", unit_scale=True, dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
            self.bar.set_description("starting workers")
        self.last: dict[str, float] = {}
        self.step = 0

    def update(self, records: list[Record]) -> None:
        if not records:
            return
        for _, m, *_ in records:
            self.last.update(m)
        self.step = records[-1][0]
        if self.bar is None:
            return
        seen = int(self.last.get(M.SAMPLES_SEEN, 0))
        if seen > self.bar.total:
            self.bar.total = seen
        self.bar.n = seen
        self.bar.set_description("training")
        post = {"step": self.step, "epoch": f"{self.last.get(M.EPOCH, 0):.2f}",
                "loss": f"{self.last.get(M.TRAIN_LOSS, float('nan')):.4f}",
                "B": int(self.last.get(M.BATCH_GLOBAL, 0)), "W": int(self.last.get(M.WORKERS, 0))}
        if M.VAL_PERPLEXITY in self.last:  # a language model: perplexity is what its users read
            post["val_ppl"] = f"{self.last[M.VAL_PERPLEXITY]:.2f}"
        elif M.VAL_ACCURACY in self.last:
            post["val_acc"] = f"{self.last[M.VAL_ACCURACY]:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

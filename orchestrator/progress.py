"""The driver's progress bar (tqdm on stderr): step, epoch, loss, batch, workers."""

from __future__ import annotations

import math
import sys

from orchestrator.config import RootConfig
from trainers.link import metrics as M
from trainers.link.messages import Record


def estimate_total_steps(cfg: RootConfig, functions: dict | None = None) -> int:
    """Steps of ``train.epochs`` at the initial batch (the bar's total; it grows if a run goes on longer)."""
    from trainers.workload import train_size

    n = train_size(cfg, functions)
    per_epoch = math.ceil(n / cfg.batch.size)
    whole = int(cfg.train.epochs)
    frac = cfg.train.epochs - whole
    return whole * per_epoch + math.ceil(frac * n / cfg.batch.size)


class Progress:
    """A tqdm bar on the driver: step, epoch, loss, batch, workers."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
            self.bar.set_description("starting workers")
        self.last: dict[str, float] = {}

    def update(self, records: list[Record]) -> None:
        if not records:
            return
        for _, m, *_ in records:
            self.last.update(m)
        step = records[-1][0]
        if self.bar is None:
            return
        if step > self.bar.total:
            self.bar.total = step
        self.bar.n = step
        self.bar.set_description("training")
        post = {"epoch": f"{self.last.get(M.EPOCH, 0):.2f}", "loss": f"{self.last.get(M.TRAIN_LOSS, float('nan')):.4f}",
                "B": int(self.last.get(M.BATCH_GLOBAL, 0)), "W": int(self.last.get(M.WORKERS, 0))}
        if M.VAL_ACCURACY in self.last:
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

"""The global batch: its size and how it is cut into worker slices and micro-batches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BatchConfig(BaseModel):
    """The ``batch`` section.  ``size`` is the global batch B: the training math."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=64, gt=0, description="global batch B, summed over all workers")
    max_local_batch: int = Field(default=64, gt=0, description="largest micro-batch one worker runs at once")

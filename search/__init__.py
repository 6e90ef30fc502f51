"""The Optuna search layer, one idea per module (see ``docs/architecture.md``):

* ``space``: search spaces (params, conditions, objectives); ``registry``: samplers and pruners by name;
* ``storage``: where a study lives (journal file or RDB URL); ``study``: create/continue a study,
  rebuild a trial's config;
* ``driver``: the ask/launch/watch/tell loop (``run_search``); ``records``: a trial's bookkeeping;
  ``capacity``: what the cluster fits; ``pool``: the trial actors; ``progress``: the bar and lines;
* ``trial``: a trial as a Ray actor driving one orchestrator run; ``tracking``: MLflow parent/child
  runs; ``cli``: ``python -m search``.
"""

"""The Optuna search layer: search spaces (``space``), samplers and pruners by name (``registry``),
the study driver (``study``), trials as Ray actors (``trial``), MLflow parent/child runs (``tracking``)
and the CLI (``cli``: ``python -m search``)."""

"""The driver <-> worker link: one package owns the contract between rank 0 of a worker group
and the driver (both import it; ``trainers`` never imports ``orchestrator``).

* :mod:`trainers.link.messages`: records, event dataclasses, the monitor's answers;
* :mod:`trainers.link.metrics`: the metric names, as constants;
* :mod:`trainers.link.tags`: the MLflow tag names the driver sets (``elastic.*``), as constants;
* :mod:`trainers.link.agreement`: rank 0's decisions, broadcast to every rank as named records;
* :mod:`trainers.link.channel`: rank 0's side (:class:`~trainers.link.channel.Channel`);
* :mod:`orchestrator.run.monitor`: the driver's side, the monitor actor (imports Ray);
* :mod:`trainers.link.runtime`: what the driver tells the workers of a phase.

How a run flows through it: ``docs/architecture.md``.  Import the submodules directly.
"""

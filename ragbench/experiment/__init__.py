"""Running an experiment: the validated config (typed parameter points and price sheet, built
once), what a run loads (``resources``: examples, model, index), the runner, the results folder
(records, manifest, provenance), the dry run, the judge pass and LLM question generation.

``ragbench.run(config)`` is ``ragbench.experiment.runner.run``.
"""

"""Running an experiment: the validated config, the runner, the results folder (records,
manifest, provenance), the dry run, the judge pass and LLM question generation.

``ragbench.run(config)`` is ``ragbench.experiment.runner.run``.
"""

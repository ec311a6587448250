"""The notebook workspace: helpers notebooks call (``notebook``), encrypted kernels
(``kernels``), papermill sweeps (``sweep_spec``, ``sweep_point``, ``sweep``), and rendering to
shareable HTML with secrets and paths scrubbed (``render``, ``scrub``)."""

"""The notebook workspace: helpers notebooks call (``notebook``), encrypted kernels
(``kernels``), papermill sweeps (the ``sweep`` sub-package), and rendering to
shareable HTML with secrets and paths scrubbed (``render``, ``scrub``)."""

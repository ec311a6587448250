"""The Jupyter kernels ragbench starts (``make demo``, sweeps, ``make lab``) run encrypted.

The kernel manager provisions CurveZMQ keys when the kernelspec declares support, so kernel
traffic is encrypted: the fix ipykernel 7.x names in the "Kernel is running over TCP without
encryption" warning it logs at every start otherwise. jupyter_client, pyzmq and papermill are
imported inside the functions.
"""

from __future__ import annotations

import os
from typing import Any


def kernel_config() -> Any:
    """traitlets config for the kernels papermill starts, with transport encryption. Empty with a
    jupyter_client or pyzmq too old to do it."""
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    if "transport_encryption" not in KernelManager.class_trait_names() or not zmq.has("curve"):
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def kernel_cli_args() -> list[str]:
    """:func:`kernel_config` as command-line flags for ``jupyter lab`` / ``jupyter server`` (the
    Makefile's ``lab`` target), so JupyterLab's kernels are encrypted too."""
    return [
        f"--{section}.{name}={value}"
        for section, traits in kernel_config().items()
        for name, value in traits.items()
    ]


def execute_notebook(notebook: str | os.PathLike, output: str | os.PathLike, **kwargs: Any) -> Any:
    """``papermill.execute_notebook`` with :func:`kernel_config`; keyword arguments as papermill's
    (parameters, cwd, kernel_name, progress_bar, ...). Returns the executed notebook."""
    import papermill

    return papermill.execute_notebook(str(notebook), str(output), config=kernel_config(), **kwargs)

"""Cost per query: the ``Cost`` of a record, price sheets, repricing and capacity planning.

- ``accounting``: FLOPs, KV-cache bytes, MFU and the ``Cost`` dataclass (pure functions of a
  ``Completion``, a model's facts and a price sheet); re-exported here (``ragbench.cost.Cost``).
- ``prices`` / ``prices_import``: price sheets (YAML data files with a date and a source).
- ``money``: ``dollars(sheet, usage, seconds, basis)``, the one function every dollar comes from.
- ``reprice``: a finished run's cost under another price sheet, through ``Cost``.
- ``planning``: break-even and capacity arithmetic (its tables: ``ragbench.analysis.planning``).

Imports flow down: this package uses the core (``types``, ``registry``, ``io``, ``models``) only.
"""

from ragbench.cost.accounting import (
    DEFAULT_KV_BYTES_PER_VALUE,
    Cost,
    dtype_bytes,
    format_bytes,
    forward_flops,
    kv_cache_bytes,
    mfu,
    processed_positions,
    query_kv_positions,
)

__all__ = [
    "DEFAULT_KV_BYTES_PER_VALUE",
    "Cost",
    "dtype_bytes",
    "format_bytes",
    "forward_flops",
    "kv_cache_bytes",
    "mfu",
    "processed_positions",
    "query_kv_positions",
]

"""Strict JSON for every answer we send: no NaN, no infinity (imports nothing from specdec).

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which is not JSON (RFC 8259):
browsers' ``JSON.parse`` and most clients refuse the whole message. A figure that has no value
(α of a run that drafted nothing, a rate over zero seconds) is ``null`` instead::

    >>> dumps({"alpha": float("nan"), "speedup": 1.5, "rows": [float("inf"), 2]})
    '{"alpha": null, "speedup": 1.5, "rows": [null, 2]}'
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` of ``finite(value)``, refusing (ValueError) anything that would still not be JSON."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)

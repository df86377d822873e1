"""JSON text exactly as Go's encoding/json writes maps: why libcni-compatible files need it.

libcni stores bytes it produced with ``json.Marshal`` (the result cache, a ``.conf`` up-converted to
a list). To write files a Go runtime would write byte for byte, maps get sorted keys, no spaces,
UTF-8 kept as is, and ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u00XX`` — Go's defaults.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


def dumps(value: Any) -> str:
    """Go's ``json.Marshal`` of ``value`` decoded into ``map[string]interface{}`` and back."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], text)

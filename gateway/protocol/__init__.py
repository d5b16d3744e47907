"""Wire models shared by the routes: the REST APIs' request and response models, their error
bodies, and KServe v2 inference requests (:mod:`gateway.protocol.kserve`).

Each module is imported by its own name (``from gateway.protocol.<module> import ...``); this
package re-exports nothing, so importing one room costs only what that module needs.
"""

from __future__ import annotations

__all__ = [
    "errors",
    "kserve",
    "rest",
]

"""Wire models shared by the routes: the REST APIs' request and response models, their error
bodies, and KServe v2 inference requests (:mod:`gateway.protocol.kserve`).
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = ["errors", "kserve", "rest"]

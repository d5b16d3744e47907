"""Files only the gateway's user may read: the key store and the databases of tenants' data.

``sqlite3.connect`` creates a missing database with the process umask (0644 under the usual 022),
so any local user could read the key hashes. :func:`create_private` makes the file first, mode 0600
(SQLite gives its ``-wal`` and ``-shm`` files the database's mode), and tightens an existing one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_MODE", "create_private"]

#: read and write for the owner only
PRIVATE_MODE = 0o600


def create_private(path: Path) -> None:
    """Create ``path`` (and its missing parent directories, mode 0700) readable by its owner only.

    An existing file keeps its content; group and other permissions are removed from it.

    Raises:
        OSError: the file or a parent cannot be created, or its mode cannot be changed.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(
        path, os.O_CREAT | os.O_WRONLY, PRIVATE_MODE
    )  # the mode applies only if it is created
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):  # left by an earlier run with a looser mode
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists() and stat.S_IMODE(sidecar.stat().st_mode) & 0o077:
            sidecar.chmod(PRIVATE_MODE)

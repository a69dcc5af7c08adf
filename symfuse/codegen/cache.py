"""The folder generated code is loaded from: private to its user, or none at all.

symfuse loads the libraries and modules it builds, so a folder other users can write to is
refused; one that cannot be created or written falls back to a private temporary folder.
Both backends build into it.
"""

from __future__ import annotations

import logging
import os
import tempfile

from symfuse.errors import BuildError

log = logging.getLogger("symfuse")

private: dict[str, str] = {}  # this process's fallback folder, once made


def fallback(folder: str, why: str) -> str:
    if "folder" not in private:
        private["folder"] = tempfile.mkdtemp(prefix="symfuse-kernels-")  # 0700, this process's own
    log.warning("symfuse: the kernel cache %s %s; building in %s for this process", folder, why, private["folder"])
    return private["folder"]


def cache_folder(path: str) -> str:
    """The kernel cache, checked before any library in it is loaded: created private (0700);
    one that other users can write to is refused (they could put code there that this
    process would run); one that cannot be created or written falls back, with a warning,
    to a private temporary folder."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        return fallback(path, f"cannot be created ({e})")
    mode = os.stat(path).st_mode
    if mode & 0o022:
        raise BuildError(
            f"the kernel cache {path} is writable by other users (mode {oct(mode & 0o777)}); symfuse loads "
            f"compiled code from it, so it will not use it: run `chmod go-w {path}` or set SYMFUSE_CACHE_DIR to "
            "a private folder"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        return fallback(path, "is not writable")
    return path

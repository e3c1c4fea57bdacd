"""The model cache: built-in models become ordinary Hugging Face folders, built once per machine, atomically.

Neighbours: ``tiny`` and ``smollm2`` hand a *builder* (a function that writes an HF folder into a given directory)
to :func:`ensure`; ``models.resolve`` is the only caller.

Invariants:
- A folder under the cache root either does not exist or is complete: a builder writes into a temporary sibling
  directory which is renamed into place (``kubeforge.runtime.publish``; rename is atomic on one file system).
- Two processes starting at once never both build: an exclusive ``flock`` on ``<root>/.<name>.lock`` serialises
  them; the second finds the finished folder when it gets the lock.
- Folder names carry a version, so a changed builder never reuses an old folder.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from collections.abc import Callable, Iterator

from kubeforge.runtime import publish

ENV_CACHE = "KUBEFORGE_CACHE"
COMPLETE_MARKER = ".kubeforge-complete"

Builder = Callable[[pathlib.Path], None]


def root() -> pathlib.Path:
    """The cache root for models: ``$KUBEFORGE_CACHE/models`` or ``~/.cache/kubeforge/models``."""
    base = os.environ.get(ENV_CACHE)
    return (pathlib.Path(base) if base else pathlib.Path.home() / ".cache" / "kubeforge") / "models"


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(name: str, build: Builder, *, cache_root: pathlib.Path | None = None) -> pathlib.Path:
    """Return ``<root>/<name>``, calling ``build(tmpdir)`` first if it is not there yet (once per machine)."""
    base = cache_root or root()
    final = base / name
    if (final / COMPLETE_MARKER).exists():
        return final
    with _locked(base / f".{name}.lock"):
        if (final / COMPLETE_MARKER).exists():
            return final
        with publish.folder(final) as tmp:  # replaces a partial folder from an older, non-atomic writer
            build(tmp)
            (tmp / COMPLETE_MARKER).write_text("ok\n")
    return final

"""The model cache: built-in models become ordinary Hugging Face folders, built once per machine, atomically.

Neighbours: ``tiny`` and ``smollm2`` hand a *builder* (a function that writes an HF folder into a given directory)
to :func:`ensure`; ``models.resolve`` is the only caller.

Invariants:
- A folder under the cache root either does not exist or is complete: a builder writes into a temporary sibling
  directory which is renamed into place (``kubeforge.runtime.publish``; rename is atomic on one file system).
- Two processes starting at once never both build: an exclusive ``flock`` on ``<root>/.<name>.lock`` serialises
  them; the second finds the finished folder when it gets the lock.
- Folder names carry a version, so a changed builder never reuses an old folder.
- A build that leaves no ``config.json`` is an error (nothing is published), and a folder marked complete without
  one is built again: transformers' ``save_pretrained`` silently writes nothing on a torch.distributed rank other
  than 0, so a builder run after a process group exists (trainer rank >= 1 with its own cache, as in a pod) would
  otherwise publish a folder of tokenizer files only (``trainer/start`` resolves the model before joining).
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


REQUIRED = "config.json"


class BuildError(RuntimeError):
    """A builder finished without writing a model folder."""


def _complete(folder: pathlib.Path) -> bool:
    return (folder / COMPLETE_MARKER).exists() and (folder / REQUIRED).is_file()


def ensure(name: str, build: Builder, *, cache_root: pathlib.Path | None = None) -> pathlib.Path:
    """Return ``<root>/<name>``, calling ``build(tmpdir)`` first if it is not there yet (once per machine)."""
    base = cache_root or root()
    final = base / name
    if _complete(final):
        return final
    with _locked(base / f".{name}.lock"):
        if _complete(final):
            return final
        with publish.folder(final) as tmp:  # replaces a partial folder from an older, non-atomic writer
            build(tmp)
            if not (tmp / REQUIRED).is_file():
                raise BuildError(f"building model {name!r} wrote no {REQUIRED} (files: "
                                 f"{sorted(p.name for p in tmp.iterdir())}); transformers saves nothing on a "
                                 "torch.distributed rank other than 0: build before joining a process group")
            (tmp / COMPLETE_MARKER).write_text("ok\n")
    return final

"""Publishing a folder atomically: write into a temporary sibling, then rename it over the target.

Role: the one home of the temp-then-rename protocol for folders written whole (the model cache, the HF export,
the LoRA adapter). Readers see either the old folder or the complete new one, never a half-written one; a failure removes
the temporary folder and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def folder(target: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target``; on a clean exit it replaces ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

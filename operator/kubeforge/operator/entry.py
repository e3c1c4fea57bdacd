"""The operator process's entrypoint (``kubeforge operator``, ``python -m kubeforge.operator``): what must happen
before kopf is imported (``memory.skip_unused_imports``), then ``main.main``."""
from __future__ import annotations

from collections.abc import Sequence

from kubeforge.operator import memory


def main(argv: Sequence[str] | None = None) -> int:
    memory.skip_unused_imports()
    from kubeforge.operator import main as main_mod   # imports kopf

    return main_mod.main(argv)

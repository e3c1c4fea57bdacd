"""``python -m kubeforge.cli``: the same as the ``kubeforge`` console script (the launcher starts roles so)."""
from kubeforge.cli import main

if __name__ == "__main__":
    main()

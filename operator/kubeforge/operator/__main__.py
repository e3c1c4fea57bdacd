"""``python -m kubeforge.operator``: the same as ``kubeforge operator``."""
import sys

from kubeforge.operator.entry import main

sys.exit(main(sys.argv[1:]))

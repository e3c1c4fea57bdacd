"""The `kubeforge` command: a thin composition root (filled in below)."""


def main() -> None:
    raise SystemExit("kubeforge: not yet")

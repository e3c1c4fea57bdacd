"""The ``kubeforge`` command: a thin composition root that parses a subcommand and imports its side lazily.

Subcommands:
- ``kubeforge run FILE [--run-dir DIR] [--steps N]`` → ``kubeforge.runtime.launcher`` (local run of an RLJob)
- ``kubeforge role generator|verifier|trainer`` → ``kubeforge.runtime.role`` (the container entrypoint)
- ``kubeforge operator ...`` → ``kubeforge.operator.entry:main`` (argv passed through)
- ``kubeforge crd ...`` → ``kubeforge.api.crd:main`` (argv passed through)
- ``kubeforge export RUN_DIR [--wait S]`` → ``kubeforge.runtime.trainer.export_requests`` (ask a local run for its
  current policy as an HF folder; prints ``{"request", "export", "step"}`` once trainer 0 wrote it, exit 1 if not in
  time)
- ``kubeforge validate FILE`` → ``kubeforge.api.load`` (offline: the checks of the launcher and of the admission
  webhook; refused: the lines ``kubeforge run`` prints, ``kubeforge: FILE: path: message`` on stderr, exit 2)

Invariant: importing this module imports neither torch nor vLLM nor the operator; each subcommand pulls in only
what it needs, so the operator image (no runtime extra) runs ``kubeforge operator`` unchanged.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import cast

ROLES = ("generator", "verifier", "trainer")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubeforge", description="Kubernetes-native RL post-training (GRPO).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run an RLJob locally: every role as a process, supervised")
    run.add_argument("file", help="RLJob manifest (YAML)")
    run.add_argument("--run-dir", default=None, help="run directory (default runs/<name>-<timestamp>/)")
    run.add_argument("--steps", type=int, default=None, help="override spec.algorithm.steps")
    role = sub.add_parser("role", help="run one role process (the container entrypoint)")
    role.add_argument("role", choices=ROLES)
    exp = sub.add_parser("export", help="ask a running local job for its current policy as an HF folder")
    exp.add_argument("run_dir", help="the run directory of `kubeforge run`")
    exp.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the folder (0: do not wait)")
    val = sub.add_parser("validate", help="check an RLJob manifest offline, as the cluster and the launcher do")
    val.add_argument("file", help="RLJob manifest (YAML or JSON; - for stdin)")
    sub.add_parser("operator", help="run the operator (arguments are passed through)", add_help=False)
    sub.add_parser("crd", help="print or write the CRD (arguments are passed through)", add_help=False)
    return p


def _dispatch(target: str, argv: Sequence[str]) -> int:
    """Call ``module:function`` with argv, the way a console script would."""
    module, _, func = target.partition(":")
    fn = cast(Callable[..., object], getattr(importlib.import_module(module), func))
    sys.argv = [f"kubeforge {module.rsplit('.', 1)[-1]}", *argv]
    result = fn(list(argv)) if inspect.signature(fn).parameters else fn()
    return result if isinstance(result, int) else 0


EXIT_INVALID = 2     # kubeforge.api.load.EXIT_INVALID (spelled here too: importing load here would import pydantic)


def validate(file: str) -> int:
    """``kubeforge validate FILE``: ``FILE: valid`` on stdout and exit 0, or the refusal ``kubeforge run`` prints
    (``load.refusal``: one ``kubeforge: FILE: path: message`` line per problem on stderr) and exit 2."""
    from kubeforge.api import load

    try:
        text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
    except OSError as exc:
        sys.stderr.write(load.refusal(file, [str(exc.strerror or exc)]))
        return load.EXIT_INVALID
    try:
        load.parse_text(text)
    except load.InvalidRLJob as exc:
        sys.stderr.write(load.refusal(file, exc.problems))
        return load.EXIT_INVALID
    print(f"{file}: valid")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "operator":
        raise SystemExit(_dispatch("kubeforge.operator.entry:main", args_in[1:]))
    if args_in and args_in[0] == "crd":
        raise SystemExit(_dispatch("kubeforge.api.crd:main", args_in[1:]))
    args = _parser().parse_args(args_in)
    if args.command == "run":
        import kubeforge.runtime.launcher.main
        raise SystemExit(kubeforge.runtime.launcher.main.run(file=args.file, run_dir=args.run_dir, steps=args.steps))
    if args.command == "validate":
        raise SystemExit(validate(args.file))
    if args.command == "export":
        from kubeforge.runtime.trainer import export_requests
        raise SystemExit(export_requests.cli(run_dir=args.run_dir, wait_s=args.wait))
    if args.command == "role":
        from kubeforge.runtime import role
        raise SystemExit(role.run(role=args.role))
    raise SystemExit(2)

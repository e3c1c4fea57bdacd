"""The ``kubeforge`` command: a thin composition root that parses a subcommand and imports its side lazily.

Subcommands:
- ``kubeforge run FILE [--run-dir DIR] [--steps N]`` → ``kubeforge.runtime.launcher`` (local run of an RLJob); with
  a GeneratorPool and its jobs (``kubeforge run pool.yaml job-a.yaml ...``) the files are checked together, then
  ``kubeforge.runtime.launcher.poolrun`` runs the pool's engines and the jobs (docs/generator-pool.md)
- ``kubeforge role generator|verifier|trainer|agent|sandbox`` → ``kubeforge.runtime.role`` (the container entrypoint;
  ``agent``: an agent pod's process, ``spec.agent``; ``sandbox``: a sandbox pod's, ``spec.sandbox``)
- ``kubeforge operator ...`` → ``kubeforge.operator.entry:main`` (argv passed through)
- ``kubeforge crd ...`` → ``kubeforge.api.crd:main`` (argv passed through)
- ``kubeforge export RUN_DIR [--wait S]`` → ``kubeforge.runtime.trainer.export_requests`` (ask a local run for its
  current policy as an HF folder; prints ``{"request", "export", "step"}`` once trainer 0 wrote it, exit 1 if not in
  time)
- ``kubeforge validate FILE...`` → ``kubeforge.api.load`` (offline: the checks of the launcher and of the admission
  webhook, each job also against the GeneratorPool it names among the files; refused: the lines ``kubeforge run``
  prints, ``kubeforge: FILE: path: message`` on stderr, exit 2)

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

# agent: an agent pod's process (spec.agent); sandbox: a sandbox pod's process (spec.sandbox)
ROLES = ("generator", "verifier", "trainer", "agent", "sandbox")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubeforge", description="Kubernetes-native RL post-training (GRPO).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run an RLJob locally: every role as a process, supervised")
    run.add_argument("files", nargs="+", metavar="FILE", help="RLJob manifest (YAML); or a GeneratorPool and the "
                     "jobs that name it")
    run.add_argument("--run-dir", default=None, help="run directory (default runs/<name>-<timestamp>/)")
    run.add_argument("--steps", type=int, default=None, help="override spec.algorithm.steps")
    role = sub.add_parser("role", help="run one role process (the container entrypoint)")
    role.add_argument("role", choices=ROLES)
    exp = sub.add_parser("export", help="ask a running local job for its current policy as an HF folder")
    exp.add_argument("run_dir", help="the run directory of `kubeforge run`")
    exp.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the folder (0: do not wait)")
    val = sub.add_parser("validate", help="check RLJob (and GeneratorPool) manifests offline, as the cluster and the "
                         "launcher do")
    val.add_argument("files", nargs="+", metavar="FILE", help="RLJob or GeneratorPool manifest (YAML or JSON; - for "
                     "stdin); a job is also checked against the pool it names among the files")
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


def _read(files: Sequence[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each file's text (``-``: stdin), and the files that could not be read with why."""
    texts: dict[str, str] = {}
    unread: dict[str, list[str]] = {}
    for file in files:
        try:
            texts[file] = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        except OSError as exc:
            unread[file] = [str(exc.strerror or exc)]
    return texts, unread


def _check(files: Sequence[str]) -> list[str]:
    """The files checked together (``load.check_texts``); each refused one's lines written to stderr
    (``load.refusal``). Returns the files that passed."""
    from kubeforge.api import load

    texts, unread = _read(files)
    _, problems = load.check_texts(texts)
    problems.update(unread)
    for file in files:
        if file in problems:
            sys.stderr.write(load.refusal(file, problems[file]))
    return [f for f in files if f not in problems]


def validate(files: str | Sequence[str]) -> int:
    """``kubeforge validate FILE...``: ``FILE: valid`` on stdout per file and exit 0, or the refusal ``kubeforge run``
    prints (``load.refusal``: one ``kubeforge: FILE: path: message`` line per problem on stderr) and exit 2."""
    files = [files] if isinstance(files, str) else list(files)
    passed = _check(files)
    for file in passed:
        print(f"{file}: valid")
    return 0 if len(passed) == len(files) else EXIT_INVALID


def run(files: Sequence[str], *, run_dir: str | None, steps: int | None) -> int:
    """``kubeforge run``: one RLJob runs locally (``kubeforge.runtime.launcher``); a GeneratorPool and the jobs that
    name it, once checked together as ``kubeforge validate`` checks them, run as the pool's engines and the jobs'
    trainers and verifiers (``kubeforge.runtime.launcher.poolrun``)."""
    if len(files) == 1:
        from kubeforge.api import load, rljob

        texts, _ = _read(files)
        doc = texts.get(files[0])
        try:
            single = load.parse_any_text(doc) if doc is not None else None
        except load.InvalidRLJob:
            single = None     # the launcher refuses it with its own words, which are validate's
        if single is None or (isinstance(single, rljob.RLJob) and single.spec.generator_pool is None):
            import kubeforge.runtime.launcher.main
            return kubeforge.runtime.launcher.main.run(file=files[0], run_dir=run_dir, steps=steps)
    if len(_check(files)) != len(files):
        return EXIT_INVALID
    import kubeforge.runtime.launcher.poolrun
    return kubeforge.runtime.launcher.poolrun.run(files=list(files), run_dir=run_dir, steps=steps)


def main(argv: Sequence[str] | None = None) -> None:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "operator":
        raise SystemExit(_dispatch("kubeforge.operator.entry:main", args_in[1:]))
    if args_in and args_in[0] == "crd":
        raise SystemExit(_dispatch("kubeforge.api.crd:main", args_in[1:]))
    args = _parser().parse_args(args_in)
    if args.command == "run":
        raise SystemExit(run(args.files, run_dir=args.run_dir, steps=args.steps))
    if args.command == "validate":
        raise SystemExit(validate(args.files))
    if args.command == "export":
        from kubeforge.runtime.trainer import export_requests
        raise SystemExit(export_requests.cli(run_dir=args.run_dir, wait_s=args.wait))
    if args.command == "role":
        from kubeforge.runtime import role
        raise SystemExit(role.run(role=args.role))
    raise SystemExit(2)

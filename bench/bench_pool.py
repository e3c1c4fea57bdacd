"""Benchmark of a GeneratorPool (issue 40 item 7): N LoRA jobs each with a generator of its own vs the same N jobs
on one pool of one engine, one mode after the other on this machine, same steps.

    python bench/bench_pool.py [--jobs 4] [--steps 12] [--example tiny|smollm2] [--model NAME]

The jobs are a pool example's, each with a seed of its own (job k: seed k), all started at once in each mode:
- ``--example tiny`` (the default): ``examples/pool/job-a.yaml`` (the tiny model copies one character, rank-8
  adapters), alphabet ``ab`` or ``xy`` by parity; it does not learn in a few steps (docs/generator-pool.md);
- ``--example smollm2``: ``examples/pool/smollm2/job-a.yaml`` and ``job-b.yaml`` by parity (SmolLM2-135M-Instruct,
  one-digit sums and products, 8 new tokens at temperature 1.0): jobs whose step rewards rise within ~10 steps.

- separate (the baseline): each job alone with ``kubeforge run job-k.yaml`` (no ``spec.generatorPool``: its own
  vLLM generator with LoRA, the pool's engine settings), the N launchers side by side;
- pool: ``kubeforge run pool.yaml job-0.yaml ... job-N-1.yaml``, one engine with ``maxAdapters: N`` (no swaps).

Figures, per mode:
- ``completions_per_second_<mode>``: the completions trained on in steps 2..S of every job, over the span from the
  first job's end of step 1 to the last job's end of step S (``StepRecord.time``): the launcher's per-job
  definition (``launcher.summary``: step 1 carries the engine's start and is dropped) over the union of the jobs.
  ``completions_per_wall_second`` adds the starts: every completion over the mode's whole wall time;
  ``completions_per_second_jobs_summed`` is the sum of each job's own rate (steps 2..S over its own span), which does
  not count against a mode the time its jobs' first steps end apart (separate generators start at different times).
- ``generator_rss_mib_<mode>``: the peak, over samples every ``SAMPLE_SECONDS``, of the summed resident memory
  (``VmRSS`` in ``/proc/<pid>/status``) of every generator process of the mode and its children (vLLM's engine
  core): the processes started as ``kubeforge role generator`` below the bench's launchers, found anew at each
  sample by walking ``/proc``. RSS counts a page shared by two processes twice (the torch and vLLM libraries
  each engine maps), so ``generator_pss_mib_<mode>`` gives the same peak in PSS (``/proc/<pid>/smaps_rollup``),
  which splits shared pages among the processes sharing them.
- ``all_rss_mib_<mode>``: the same peak over every process below the launchers (trainers and verifiers too): what
  the mode needs of the machine's memory.
- each job's ``reward_first``/``reward_last``: its mean reward over the first and the last third of its steps
  (the bench's window, ``reward_window`` steps; the launcher's own 10-step window would overlap in a short run), and
  its held-out greedy accuracy ``eval_accuracy_before``/``_after`` when the example evaluates (``spec.evaluation``:
  the launcher's summary line of the job).

``--one-at-a-time`` runs the separate jobs one after another instead (each alone, one job's memory at a time: how
each job learns alone, set beside the pool's run; no throughput ratio then).

Nothing is asserted or hard-coded; the machine (``common.machine()``) and the load average before and after each mode
are printed beside the figures, since a shared machine's load moves between the two modes. Every figure is JSON;
the last line is the result.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

import common

ROOT = common.ROOT
EXAMPLES = {"tiny": (ROOT / "examples" / "pool", ("job-a.yaml",)),
            "smollm2": (ROOT / "examples" / "pool" / "smollm2", ("job-a.yaml", "job-b.yaml"))}
SAMPLE_SECONDS = 0.5
GENERATOR_ARGV = ("kubeforge.cli", "role", "generator")   # how every launcher starts a generator or a pool engine
ALPHABETS = ("ab", "xy")
POOL_NAME = "bench-pool"


def job_doc(k: int, *, model: str | None, steps: int, pool: str | None, example: str = "tiny") -> dict[str, Any]:
    """Job ``k`` of the bench: the pool example's job (by parity where it has two) with seed ``k``; on ``pool`` or
    (None) with its own generator; ``model``: another builtin base model (None: the example's)."""
    folder, files = EXAMPLES[example]
    doc: dict[str, Any] = yaml.safe_load((folder / files[k % len(files)]).read_text())
    doc["metadata"]["name"] = f"bench-pool-job-{k}"
    spec = doc["spec"]
    if model is not None:
        spec["model"]["builtin"] = model
    spec["task"]["seed"] = k
    if "copy" in spec["task"]:
        spec["task"]["copy"]["alphabet"] = ALPHABETS[k % len(ALPHABETS)]
    spec["algorithm"]["steps"] = steps
    spec.pop("checkpoint", None)         # no checkpoint writes in the timed window (both modes alike)
    if pool is None:
        spec.pop("generatorPool")
    else:
        spec["generatorPool"] = {"name": pool}
    return doc


def pool_doc(*, jobs: int, model: str | None, example: str = "tiny") -> dict[str, Any]:
    """The pool example with one adapter slot per job (no swaps: the pool's cost is sharing alone)."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES[example][0] / "pool.yaml").read_text())
    doc["metadata"]["name"] = POOL_NAME
    if model is not None:
        doc["spec"]["model"]["builtin"] = model
    doc["spec"]["maxAdapters"] = jobs
    return doc


def write(docs: Iterable[tuple[str, dict[str, Any]]], folder: pathlib.Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, doc in docs:
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(str(path))
    return out


# ---------------------------------------------------------------------------------------------- memory (/proc)

def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc now."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _subtree(pid: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def generator_pids(roots: Sequence[int]) -> list[int]:
    """Every process of a generator below ``roots`` (the bench's launchers): each process started as ``kubeforge
    role generator`` and everything below it."""
    children = _children()
    below = [p for r in roots for p in _subtree(r, children)]
    engines = [p for p in below if _is_generator(_argv(p))]
    return sorted({p for e in engines for p in _subtree(e, children)})


def _is_generator(argv: Sequence[str]) -> bool:
    n = len(GENERATOR_ARGV)
    return any(tuple(argv[i:i + n]) == GENERATOR_ARGV for i in range(len(argv) - n + 1))


def _kib(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mib(pids: Sequence[int]) -> tuple[float, float]:
    """(summed RSS, summed PSS) of ``pids`` in MiB; a process gone meanwhile counts 0."""
    rss = sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in pids)
    pss = sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    return rss / 1024, pss / 1024


@dataclasses.dataclass
class MemorySampler:
    """A thread sampling the generators' memory below ``roots`` every ``period`` seconds; keeps the peaks."""

    roots: list[int]
    period: float = SAMPLE_SECONDS
    peak_rss_mib: float = 0.0
    peak_pss_mib: float = 0.0
    peak_processes: int = 0
    peak_all_rss_mib: float = 0.0     # every process below the roots (trainers, verifiers, launchers too)
    samples: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        pids = generator_pids(self.roots)
        rss, pss = memory_mib(pids)
        children = _children()
        everything = sorted({p for r in self.roots for p in _subtree(r, children)})
        self.peak_all_rss_mib = max(self.peak_all_rss_mib,
                                    sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in everything) / 1024)
        self.samples += 1
        self.peak_processes = max(self.peak_processes, len(pids))
        self.peak_rss_mib, self.peak_pss_mib = max(self.peak_rss_mib, rss), max(self.peak_pss_mib, pss)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10 * self.period + 5)


# ---------------------------------------------------------------------------------------------- figures

def aggregate(records: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Completions per second of the jobs together (the module docstring), from each job's step records (dicts with
    ``step``, ``time``, ``completions``)."""
    ends = [recs[0]["time"] for recs in records.values() if recs]
    lasts = [recs[-1]["time"] for recs in records.values() if recs]
    done = sum(r["completions"] for recs in records.values() for r in recs[1:])
    span = max(lasts) - min(ends) if ends else 0.0
    rates = [sum(r["completions"] for r in recs[1:]) / (recs[-1]["time"] - recs[0]["time"])
             for recs in records.values() if len(recs) > 1 and recs[-1]["time"] > recs[0]["time"]]
    return {"completions_per_second": round(done / span, 3) if span > 0 else None, "span_seconds": round(span, 2),
            "completions_per_second_jobs_summed": round(sum(rates), 3) if rates else None,
            "completions_after_step_1": done,
            "completions": sum(r["completions"] for recs in records.values() for r in recs)}


def rewards(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean reward over the first and the last third of the steps (at least one step each)."""
    values = [r["mean_reward"] for r in recs if r.get("mean_reward") is not None]
    window = max(1, len(values) // 3)
    mean = (lambda xs: round(sum(xs) / len(xs), 4) if xs else None)
    return {"steps": len(recs), "reward_window": window, "reward_first": mean(values[:window]),
            "reward_last": mean(values[-window:])}


def read_steps(path: pathlib.Path) -> list[dict[str, Any]]:
    """A job's metrics records, one per step (the last record of a step wins, as ``launcher.summary.by_step``)."""
    last: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "step" in rec and "time" in rec:
                last[int(rec["step"])] = rec
    return [last[s] for s in sorted(last)]


# ---------------------------------------------------------------------------------------------- the two modes

def _launch(files: Sequence[str], *, run_dir: pathlib.Path, log: pathlib.Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "run", *files, "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=run_dir.parent)


def run_mode(mode: str, launches: list[tuple[list[str], pathlib.Path]], *, jobs: list[str],
             metrics: dict[str, pathlib.Path], timeout: float, one_at_a_time: bool = False) -> dict[str, Any]:
    """Start every launch at once (``one_at_a_time``: each after the previous ended, so the memory peak is one
    launch's), sample the generators' memory until all end; the mode's figures."""
    load_before, started = common.load_average(), time.monotonic()
    outs: list[tuple[str, int | None, pathlib.Path]] = []
    peaks = MemorySampler(roots=[])
    for batch in ([[x] for x in launches] if one_at_a_time else [launches]):
        procs = []
        for files, run_dir in batch:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            procs.append((_launch(files, run_dir=run_dir, log=run_dir.parent / f"{run_dir.name}.stderr"), run_dir))
        sampler = MemorySampler(roots=[p.pid for p, _ in procs]).start()
        try:
            outs += [(p.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))[0], p.returncode, d)
                     for p, d in procs]
        finally:
            sampler.stop()
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
        peaks.peak_rss_mib = max(peaks.peak_rss_mib, sampler.peak_rss_mib)
        peaks.peak_pss_mib = max(peaks.peak_pss_mib, sampler.peak_pss_mib)
        peaks.peak_all_rss_mib = max(peaks.peak_all_rss_mib, sampler.peak_all_rss_mib)
        peaks.peak_processes = max(peaks.peak_processes, sampler.peak_processes)
        peaks.samples += sampler.samples
    sampler = peaks
    wall = time.monotonic() - started
    for _, code, run_dir in outs:
        if code != 0:
            log = run_dir.parent / f"{run_dir.name}.stderr"
            raise SystemExit(f"{mode}: kubeforge run failed ({code}):\n{log.read_text()[-3000:]}")
    records = {j: read_steps(metrics[j]) for j in jobs}
    lines = [json.loads(x) for out, _, _ in outs for x in out.strip().splitlines() if x]
    return {"mode": mode, "wall_seconds": round(wall, 1), **aggregate(records),
            "completions_per_wall_second": round(sum(r["completions"] for rs in records.values() for r in rs) / wall,
                                                 3),
            "generator_rss_mib": round(sampler.peak_rss_mib, 1), "generator_pss_mib": round(sampler.peak_pss_mib, 1),
            "all_rss_mib": round(sampler.peak_all_rss_mib, 1),
            "generator_processes": sampler.peak_processes, "memory_samples": sampler.samples,
            "jobs": {j: {**rewards(records[j]), **held_out(j, lines)} for j in jobs},
            "launcher_lines": lines,
            "load_before": load_before, "load_after": common.load_average()}


def held_out(job: str, lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The job's held-out greedy accuracy before its first step and after its last, from its launcher summary line
    (a pool's lines name their job; a single job's line is found by its run directory); None without evaluation."""
    line = next((x for x in lines if x.get("job") == job or pathlib.PurePath(str(x.get("run_dir", ""))).name == job),
                {})
    return {"eval_accuracy_before": line.get("eval_accuracy_before"),
            "eval_accuracy_after": line.get("eval_accuracy_after")}


def separate(*, jobs: int, model: str | None, steps: int, tmp: pathlib.Path, timeout: float,
             example: str = "tiny", one_at_a_time: bool = False) -> dict[str, Any]:
    names = [f"bench-pool-job-{k}" for k in range(jobs)]
    files = write(((n, job_doc(k, model=model, steps=steps, pool=None, example=example))
                   for k, n in enumerate(names)),
                  tmp / "separate" / "manifests")
    runs = {n: tmp / "separate" / n for n in names}
    return run_mode("separate", [([f], runs[n]) for f, n in zip(files, names)], jobs=names,
                    metrics={n: runs[n] / "metrics.jsonl" for n in names}, timeout=timeout,
                    one_at_a_time=one_at_a_time)


def pooled(*, jobs: int, model: str | None, steps: int, tmp: pathlib.Path, timeout: float,
           example: str = "tiny") -> dict[str, Any]:
    names = [f"bench-pool-job-{k}" for k in range(jobs)]
    files = write([("pool", pool_doc(jobs=jobs, model=model, example=example)),
                   *((n, job_doc(k, model=model, steps=steps, pool=POOL_NAME, example=example))
                     for k, n in enumerate(names))],
                  tmp / "pool" / "manifests")
    run = tmp / "pool" / "run"
    out = run_mode("pool", [(files, run)], jobs=names, metrics={n: run / n / "metrics.jsonl" for n in names},
                   timeout=timeout)
    summary = out["launcher_lines"][-1]
    out["engine_share"] = {n: summary["jobs"][n]["engine_share"] for n in names}
    out["adapter_swaps"] = sum(summary["jobs"][n]["adapter_swaps"] for n in names)
    return out


def result(sep: dict[str, Any], pool: dict[str, Any], *, jobs: int, steps: int, model: str | None,
           example: str = "tiny", one_at_a_time: bool = False) -> dict[str, Any]:
    """The last line: the contract's fields, the ratios, each job's rewards in both modes. With the separate jobs
    run one at a time, the throughput ratios are None (one generator at a time is not the baseline of N at once);
    the memory ratios are then one job's generator against the pool's."""
    ratio = (lambda a, b: round(a / b, 3) if a and b else None)
    rate = (lambda a, b: None if one_at_a_time else ratio(a, b))
    return {
        "bench": "pool", "jobs": jobs, "steps": steps, "example": example, "model": model,
        "separate_one_at_a_time": one_at_a_time, "machine": common.machine(),
        "completions_per_second_pool": pool["completions_per_second"],
        "completions_per_second_separate": sep["completions_per_second"],
        "ratio_completions_pool_over_separate": rate(pool["completions_per_second"], sep["completions_per_second"]),
        "completions_per_wall_second": {"pool": pool["completions_per_wall_second"],
                                        "separate": sep["completions_per_wall_second"]},
        "completions_per_second_jobs_summed": {"pool": pool["completions_per_second_jobs_summed"],
                                               "separate": sep["completions_per_second_jobs_summed"]},
        "ratio_jobs_summed_pool_over_separate": rate(pool["completions_per_second_jobs_summed"],
                                                      sep["completions_per_second_jobs_summed"]),
        "generator_rss_mib_pool": pool["generator_rss_mib"], "generator_rss_mib_separate": sep["generator_rss_mib"],
        "ratio_rss_pool_over_separate": ratio(pool["generator_rss_mib"], sep["generator_rss_mib"]),
        "generator_pss_mib_pool": pool["generator_pss_mib"], "generator_pss_mib_separate": sep["generator_pss_mib"],
        "ratio_pss_pool_over_separate": ratio(pool["generator_pss_mib"], sep["generator_pss_mib"]),
        "all_rss_mib": {"pool": pool["all_rss_mib"], "separate": sep["all_rss_mib"]},
        "memory_method": f"peak over samples every {SAMPLE_SECONDS}s of the sum over /proc of every generator "
                         "process and its children (VmRSS; Pss from smaps_rollup)",
        "rewards": {"separate": sep["jobs"], "pool": pool["jobs"]},
        "engine_share": pool["engine_share"], "adapter_swaps": pool["adapter_swaps"],
        "wall_seconds": {"separate": sep["wall_seconds"], "pool": pool["wall_seconds"]},
        "load": {"separate": [sep["load_before"], sep["load_after"]], "pool": [pool["load_before"], pool["load_after"]]},
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4, help="LoRA jobs (default 4)")
    ap.add_argument("--steps", type=int, default=12, help="steps of every job (default 12)")
    ap.add_argument("--example", choices=sorted(EXAMPLES), default="tiny",
                    help="the pool example the jobs come from (default tiny; smollm2: jobs that learn)")
    ap.add_argument("--model", default=None, help="another builtin base model for every job and the pool "
                    "(default: the example's)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds each mode may take (default 3600)")
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep the run directories (default: a temp dir)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="run the separate jobs one after another (each alone: one job's memory at a time; no "
                    "throughput ratio), e.g. to compare each job's learning alone with the pool's")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.steps < 1:
        ap.error("--jobs and --steps must be at least 1")
    print(json.dumps({"machine": common.machine(), "load": common.load_average()}), flush=True)
    with tempfile.TemporaryDirectory(prefix="kf-bench-pool-") as d:
        tmp = pathlib.Path(args.keep or d).resolve()
        sep = separate(jobs=args.jobs, model=args.model, steps=args.steps, tmp=tmp, timeout=args.timeout,
                       example=args.example, one_at_a_time=args.one_at_a_time)
        print(json.dumps({k: v for k, v in sep.items() if k != "launcher_lines"}), flush=True)
        pool = pooled(jobs=args.jobs, model=args.model, steps=args.steps, tmp=tmp, timeout=args.timeout,
                      example=args.example)
        print(json.dumps({k: v for k, v in pool.items() if k != "launcher_lines"}), flush=True)
    print(json.dumps(result(sep, pool, jobs=args.jobs, steps=args.steps, model=args.model, example=args.example,
                            one_at_a_time=args.one_at_a_time)), flush=True)


if __name__ == "__main__":
    main()

"""The local rehearsal of docs/guide.md (`make guide-rehearsal`): the guide's manifest, run with `kubeforge run`.

What it does, in the guide's order:
1. makes a Hugging Face model folder, ``<workdir>/models/my-model``: the builder of the built-in ``tiny`` model
   (``kubeforge.runtime.models.tiny.build``: a random tiny Qwen2 and its byte-level tokenizer, built from code under
   a fixed seed, nothing downloaded), so the folder holds the very weights ``model: {builtin: tiny}`` resolves to;
2. writes a JSONL file, ``<workdir>/data/train.jsonl``: one ``{"prompt": "copy: a", "answer": "a"}`` record per
   line, the records of ``examples/tiny.yaml``'s copy task (the task the tiny model learns in minutes);
3. writes ``<workdir>/own-model.local.yaml``: ``examples/own-model.yaml`` with exactly two fields changed,
   ``spec.model.path`` and ``spec.task.jsonl.path``, to the paths above (:data:`LOCAL_FIELDS`). Everything else,
   the roles' volumes included, is the cluster manifest: ``kubeforge run`` reads the files where the paths say and
   ignores the volumes (and the gang and the checkpoint claim: a local run keeps checkpoints in its run directory);
   on a cluster those two paths are where the volumes are mounted. ``tests/test_guide.py`` checks that nothing
   else differs;
4. runs ``kubeforge run <that file> --run-dir <workdir>/run`` and prints its stdout, whose last line is the run's
   summary JSON (``reward_first`` / ``reward_last``: mean reward of the first and the last 10 steps); exits with its
   status.

Usage: ``python e2e/guide_rehearsal.py [--workdir DIR] [--steps N] [--records N]``. Progress (the launcher's bar and
messages) goes to stderr. Neighbours: ``tests/test_guide.py`` (the manifest checks), ``tests/runtime/
test_guide_rehearsal.py`` (runs this), ``e2e/test_guide_real.py`` (the cluster variant on the real node).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "own-model.yaml"
#: The only fields of the guide's manifest the rehearsal changes: the paths the cluster's volumes serve.
LOCAL_FIELDS: tuple[tuple[str, ...], ...] = (("spec", "model", "path"), ("spec", "task", "jsonl", "path"))
MODEL_DIR = "models/my-model"       # under the workdir, as under the models claim's mount (/models/my-model)
JSONL = "data/train.jsonl"          # as under the data claim's mount (/data/train.jsonl)
ALPHABET = "ab"                     # examples/tiny.yaml: copy {length: 1, alphabet: "ab"}
PREFIX = "copy: "                   # kubeforge.runtime.tasks.copy.PREFIX (the prompt the tiny model learns on)


def log(msg: str) -> None:
    print(f"[guide-rehearsal {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_manifest(path: pathlib.Path = MANIFEST) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path}: not a mapping"
    return doc


def make_model_folder(target: pathlib.Path) -> pathlib.Path:
    """An HF folder holding the built-in tiny model (config, safetensors, tokenizer): the builder it is cached from."""
    from kubeforge.runtime.models import tiny

    target.mkdir(parents=True, exist_ok=True)
    tiny.build(target)
    # readable by every user, as the guide asks of a model folder (role pods run as UID 1000): the safetensors
    # writer leaves its file 0600, which a pod of another UID cannot open (found by e2e/test_guide_real.py)
    for f in target.iterdir():
        f.chmod(f.stat().st_mode | 0o444)
    return target


def records(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` copy records (``{"prompt": "copy: a", "answer": "a"}``), characters drawn from :data:`ALPHABET`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = rng.choice(ALPHABET)
        out.append({"prompt": f"{PREFIX}{c}", "answer": c})
    return out


def make_jsonl(path: pathlib.Path, *, n: int = 256, seed: int = 0) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records(n, seed=seed)), encoding="utf-8")
    return path


def _set(doc: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def _get(doc: dict[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = doc
    for k in keys:
        node = node[k]
    return node


def local_manifest(doc: dict[str, Any], *, model_dir: pathlib.Path, jsonl: pathlib.Path) -> dict[str, Any]:
    """``doc`` (the cluster manifest, not mutated) with :data:`LOCAL_FIELDS` pointing at local files."""
    out = copy.deepcopy(doc)
    for keys, value in zip(LOCAL_FIELDS, (str(model_dir), str(jsonl)), strict=True):
        _get(out, keys)        # the field exists in the cluster manifest: the rehearsal changes, never adds
        _set(out, keys, value)
    return out


def differences(a: Any, b: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths at which two parsed YAML documents differ (lists compared element by element)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a[k], b[k], (*path, str(k))) if k in a and k in b else [(*path, str(k))])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, (*path, str(i)))]
    return [] if a == b else [path]


def read_paths(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Per role, the paths of the manifest ``doc`` that role's pods read or write: the files of
    ``kubeforge.runtime.config.READS`` (checked by each role at its start) and the trainer's checkpoint directory."""
    from kubeforge.runtime import config

    spec = doc["spec"]
    files = {"model": spec["model"].get("path"), "task": (spec["task"].get("jsonl") or {}).get("path")}
    out = {role: [files[f] for f in sorted(reads) if files[f]] for role, reads in config.READS.items()}
    out["trainer"].append(spec.get("checkpoint", {}).get("path", "/checkpoints"))
    return out


def serving_claims(pod_spec: dict[str, Any], paths: list[str], *,
                   claim_templates: tuple[str, ...] = ()) -> dict[str, str | None]:
    """For each path, the PersistentVolumeClaim whose mount in the pod's first container holds it (the deepest
    mount wins), or None. ``claim_templates``: names of a StatefulSet's volumeClaimTemplates (a rendered pod
    template lists them as mounts without volumes)."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec.get("volumes", [])
              if "persistentVolumeClaim" in v}
    claims.update({t: f"<template {t}>" for t in claim_templates})
    mounts = sorted(((str(m["mountPath"]).rstrip("/") or "/", m["name"])
                     for m in pod_spec["containers"][0].get("volumeMounts", [])), key=lambda x: -len(x[0]))
    out: dict[str, str | None] = {}
    for path in paths:
        hit = next((name for mp, name in mounts if path == mp or path.startswith(mp.rstrip("/") + "/")), None)
        out[path] = claims.get(hit) if hit is not None else None
    return out


def prepare(workdir: pathlib.Path, *, n_records: int = 256) -> pathlib.Path:
    """The model folder, the JSONL file and the local manifest under ``workdir``; returns the manifest's path."""
    t0 = time.monotonic()
    model_dir = make_model_folder(workdir / MODEL_DIR)
    log(f"HF folder {model_dir} ({', '.join(sorted(p.name for p in model_dir.iterdir()))}) "
        f"in {time.monotonic() - t0:.1f}s")
    jsonl = make_jsonl(workdir / JSONL, n=n_records)
    log(f"JSONL {jsonl}: {n_records} records, first {jsonl.read_text().splitlines()[0]}")
    doc = local_manifest(load_manifest(), model_dir=model_dir, jsonl=jsonl)
    path = workdir / "own-model.local.yaml"
    path.write_text(f"# {MANIFEST.relative_to(ROOT)} with {', '.join('.'.join(k) for k in LOCAL_FIELDS)} "
                    "set to local paths (e2e/guide_rehearsal.py)\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="guide_rehearsal", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=pathlib.Path, help="where the folder, the JSONL and the run go "
                   "(default: a new temp dir)")
    p.add_argument("--steps", type=int, default=None, help="override spec.algorithm.steps (kubeforge run --steps)")
    p.add_argument("--records", type=int, default=256, help="JSONL records to write")
    args = p.parse_args(argv)
    workdir = (args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="kf-guide-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = prepare(workdir, n_records=args.records)
    cmd = [sys.executable, "-m", "kubeforge.cli", "run", str(manifest), "--run-dir", str(workdir / "run")]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps)]
    log(f"running: kubeforge run {manifest} --run-dir {workdir / 'run'}"
        + (f" --steps {args.steps}" if args.steps is not None else ""))
    run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    out = run.stdout.rstrip("\n")
    if out:
        print(out, flush=True)         # kubeforge run's stdout as it was: the summary JSON is its last line
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())

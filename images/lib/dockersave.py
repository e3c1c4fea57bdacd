"""Pack a root filesystem directory as a single-layer, ``docker save``-style image tar.

Role: the image builders in ``images/pause`` and ``images/base`` call this to produce tars that
``ctr -n k8s.io images import`` loads into the real node's containerd; no Docker, no registry.

Layout of the tar (what ``docker save`` writes and containerd's importer reads)::

    manifest.json                 [{"Config": "<cfg-digest>.json", "RepoTags": [ref], "Layers": ["<id>/layer.tar"]}]
    <cfg-digest>.json             image config: architecture, os, config (Cmd/Env/...), rootfs.diff_ids
    <id>/layer.tar                the uncompressed rootfs layer

Invariants: output is reproducible (entries sorted, mtime 0, owner root) so the same inputs give the same
image digest; the layer's sha256 is the config's only ``diff_id``.

Usage: ``python3 dockersave.py --rootfs DIR --ref NAME:TAG --out FILE.tar [--cmd ARG ...] [--env K=V ...]``
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """What goes into the image config besides the layer."""

    ref: str
    cmd: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"])
    workdir: str = "/"


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer_tar(*, rootfs: Path) -> bytes:
    """Return the uncompressed layer tar of ``rootfs`` (paths relative, sorted, normalised owners/times)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = sorted(p for p in rootfs.rglob("*"))
        for path in paths:
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info = _normalised(info)
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def image_config(*, spec: ImageSpec, diff_id: str) -> dict[str, object]:
    """Return the OCI/Docker image config for one layer with digest ``diff_id``."""
    config: dict[str, object] = {"Env": spec.env, "WorkingDir": spec.workdir}
    if spec.cmd:
        config["Cmd"] = spec.cmd
    if spec.entrypoint:
        config["Entrypoint"] = spec.entrypoint
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kubeforge images/lib/dockersave.py"}],
    }


def _add_bytes(tar: tarfile.TarFile, *, name: str, data: bytes) -> None:
    info = _normalised(tarfile.TarInfo(name))
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_image(*, rootfs: Path, spec: ImageSpec, out: Path) -> str:
    """Write the image tar to ``out`` atomically; return the config digest (the image id)."""
    layer = layer_tar(rootfs=rootfs)
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps(image_config(spec=spec, diff_id=f"sha256:{layer_digest}"), sort_keys=True).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{config_digest}.json", "RepoTags": [spec.ref], "Layers": [f"{layer_digest}/layer.tar"]}]
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, name=f"{config_digest}.json", data=config)
        _add_bytes(tar, name=f"{layer_digest}/layer.tar", data=layer)
        _add_bytes(tar, name="manifest.json", data=json.dumps(manifest).encode())
    os.replace(tmp, out)
    return f"sha256:{config_digest}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rootfs", type=Path, required=True)
    parser.add_argument("--ref", required=True, help="image reference, e.g. kubeforge.local/base:1")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cmd", nargs="*", default=[])
    parser.add_argument("--entrypoint", nargs="*", default=[])
    args = parser.parse_args()
    spec = ImageSpec(ref=args.ref, cmd=args.cmd, entrypoint=args.entrypoint)
    print(write_image(rootfs=args.rootfs, spec=spec, out=args.out))


if __name__ == "__main__":
    main()

"""What a refused checkpoint or store says: the cause a user can act on, not the nearest guess.

A gzipped download is not truncated (decompress it); a ViT saved under a Lightning module's
attribute is not "another architecture" (the prefix is named); a store refused for another image
list names the images added and removed; a missing view's array names the view the store does
hold; ``--heads`` that re-splits a network whose training file fixes its heads is refused. Torch-free:
the store's readers import it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from .architectures import Arch, heads_from_args

# a compressed download is not truncated: the fix is to decompress it (magic bytes → how)
MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
DECOMPRESS = {"gzip": "gzip -dc", "bzip2": "bzip2 -dc", "xz": "xz -dc", "zstd": "zstd -dc"}


def refuse_compressed(path: Path) -> None:
    """A checkpoint file that opens with a compressor's magic bytes, refused with the command that undoes it."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    found = next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)
    if found:
        raise ProbeError(
            path, f"is {found}-compressed, not a checkpoint as saved", f"decompress it first ({DECOMPRESS[found]} {path} > checkpoint.pth) and pass the result"
        )


def refuse_prefixed(backbone: Iterable[str], key: str, path: Path) -> None:
    """A ViT whose keys all carry a prefix (a PyTorch Lightning module's ``model.``): named with the fix."""
    prefix = next((k[: -len(key)] for k in sorted(backbone) if k.endswith("." + key)), None)
    if prefix:
        raise ProbeError(
            path,
            f"holds a ViT under the key prefix {prefix!r} (e.g. {prefix}{key}), as a PyTorch Lightning module saves its attribute",
            f"save the network's own state dict without the prefix ({{k.removeprefix({prefix!r}): v for k, v in sd.items()}}) and pass that file",
        )


def heads_agree(arch: Arch, extra: dict[str, Any], heads: int | None, path: Path) -> None:
    """The file's own shape wins: ``--heads`` that re-splits a network its ``args.arch`` fixes is refused."""
    fixed = heads_from_args(extra.get("args"), arch.width)
    if heads is not None and fixed and fixed[1] != heads:
        raise ProbeError(
            path, f"its args.arch {fixed[0]!r} has {fixed[1]} heads of {arch.width // fixed[1]} channels, not --heads {heads}", "omit --heads (the file says how many)"
        )


def other_views(store: str | Path | None, name: str, view: str, known: tuple[str, ...]) -> list[str]:
    """The views (of ``known``, in its order) whose keys or tokens the store's folder holds, when ``name`` (of ``view``) is missing."""
    kind = name[: -len(view) - 1] if name.endswith(f"_{view}") else ""
    if kind not in ("keys", "tokens") or store is None or not Path(store).is_dir():
        return []
    found = {p.name[len(kind) + 1 :] for p in Path(store).iterdir() if p.name.startswith(f"{kind}_") and p.name != name}
    return [v for v in known if v in found]


def named_differences(bad: list[str], held: list[str], image_ids: list[str]) -> list[str]:
    """``bad`` (manifest fields that differ) as a user reads them: the image list names the images added and removed."""
    if "image_list_sha256" not in bad:
        return bad
    added, removed = sorted(set(image_ids) - set(held)), sorted(set(held) - set(image_ids))

    def some(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    changes = [f"{len(added)} added: {some(added)}" if added else "", f"{len(removed)} removed: {some(removed)}" if removed else ""]
    said = "; ".join(c for c in changes if c) or "the same images in another order"
    return [f"the image list ({said})" if k == "image_list_sha256" else k for k in bad]


def extract_arguments(meta: dict[str, Any], views: list[str], source: str | Path) -> list[str]:
    """``probe extract``'s arguments that reproduce the store's settings for ``views`` (its identity, ``cache.IDENTITY``)."""
    info = meta.get("checkpoint") or {}
    network = str(meta.get("network", "teacher"))
    args = [
        str(info.get("path", "CHECKPOINT")),
        "--images",
        str(source),
        "--views",
        ",".join(views),
        "--chunk",
        str(meta.get("chunk")),
        "--dtype",
        str(meta.get("dtype")),
    ]
    if network != "teacher":
        args += ["--network", network]
    if info.get("converted"):
        args.append("--convert")
    arch = meta.get("arch") or {}
    if arch.get("heads") and arch.get("width") and int(arch["heads"]) != int(arch["width"]) // 64:
        args += ["--heads", str(arch["heads"])]
    from .architectures import INTERPOLATIONS  # --interp's values; DINOv3's recorded "none" (no table) is what auto gives, and is no value of it

    if meta.get("interpolation") in INTERPOLATIONS:
        args += ["--interp", str(meta["interpolation"])]
    per_view = meta.get("per_view") or {}
    if "224" in views:
        args += ["--attention", str((per_view.get("224") or {}).get("attention") or meta.get("attention") or "last")]
    if "480" in views and (per_view.get("480") or {}).get("resample", "bicubic") != "bicubic":
        args += ["--resample", str(per_view["480"]["resample"])]
    return args

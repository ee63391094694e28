"""A checkpoint named the way researchers name one: a file, a transformers or timm folder, or a Hugging Face Hub name.

- a file: read as it is (``store.checkpoints``);
- a folder holding ``model.safetensors`` (transformers' ``save_pretrained``, timm's ``push_to_hub`` and
  a Hub snapshot all write one, beside ``config.json``): that file;
- ``hf-hub:org/name`` (timm's spelling) or ``org/name`` where no such path exists: the repository's
  ``model.safetensors`` (else ``pytorch_model.bin``) through ``huggingface_hub``, so its cache,
  ``HF_HUB_CACHE`` / ``HF_HOME``, ``HF_HUB_OFFLINE`` and its token rules apply; a revision (branch,
  tag or commit) is resolved to the commit the cache holds. Nothing is downloaded where the network
  or ``HF_HUB_OFFLINE=1`` forbids it: a file not in the cache is then one line saying so.

What the name resolved to is recorded in the store's manifest (``checkpoint.source``): the repository,
its commit, the file, and the licence the repository's model card states (DINOv3's weights are under
Meta's DINOv3 licence, not Apache 2.0), beside the file's sha256 that every checkpoint records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError

PREFIXES = ("hf-hub:", "hf_hub:")  # timm's spelling of a Hub name (timm.create_model("hf-hub:timm/..."))
WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # in this order: safetensors needs no pickle at all
REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # huggingface_hub's repo id: namespace/name
FILE_SUFFIXES = {".pth", ".pt", ".bin", ".safetensors", ".ckpt", ".pkl", ".tar", ".zip", ".gz", ".xz", ".zst", ".bz2"}  # a path, never a repo
SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})$")


@dataclass(frozen=True)
class Located:
    """The weights file a checkpoint name resolved to, the name a store folder takes, and where it came from."""

    path: Path
    stem: str
    source: dict[str, Any] = field(default_factory=dict)  # empty for a plain file


def is_hub_name(name: str | Path) -> bool:
    """``hf-hub:org/name``, or ``org/name`` that is no path on this machine."""
    text = str(name)
    if text.startswith(PREFIXES):
        return True
    return bool(REPO.fullmatch(text)) and Path(text).suffix.lower() not in FILE_SUFFIXES and not Path(text).exists()


def locate(name: str | Path, revision: str | None = None) -> Located:
    """The file to read for ``name`` (see the module's docstring); ``revision`` only for a Hub name."""
    text = str(name)
    if is_hub_name(text):
        repo = text.split(":", 1)[1] if text.startswith(PREFIXES) else text
        return _from_hub(repo, revision, prefixed=text.startswith(PREFIXES))
    if revision is not None:
        raise ProbeError("--revision", f"applies to a Hugging Face Hub name, and {text} is a path", "drop --revision, or name the repository (org/name)")
    path = Path(text)
    if path.is_dir():
        return _from_folder(path)
    return Located(path, path.stem)


def _from_folder(folder: Path) -> Located:
    weights = folder / WEIGHTS[0]
    if not weights.is_file():
        sharded = (folder / f"{WEIGHTS[0]}.index.json").is_file()
        raise ProbeError(
            folder,
            "is a folder of weights in shards (model.safetensors.index.json), which probe does not join"
            if sharded
            else "is a folder without model.safetensors, so not a transformers or timm checkpoint folder",
            "pass the checkpoint file itself, or a folder holding config.json and model.safetensors",
        )
    folder = folder.resolve()
    source: dict[str, Any] = {"folder": str(folder), "file": weights.name, **_config(folder / "config.json")}
    snapshot = SNAPSHOT.search(folder.as_posix())
    if snapshot:  # a Hub snapshot named by its path: the repository and commit are in the path
        source.update(repository=f"{snapshot['org']}/{snapshot['name']}", revision=snapshot["commit"])
    source.update(_licence(folder / "README.md"))
    stem = snapshot["name"] if snapshot else folder.name
    return Located(folder / weights.name, stem, source)


def _from_hub(repo: str, revision: str | None, prefixed: bool = True) -> Located:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    if not REPO.fullmatch(repo):
        raise ProbeError(repo, "is not a Hugging Face repository name (org/name)", "name it as hf-hub:timm/vit_small_patch16_dinov3.lvd1689m or facebook/dinov2-small")
    wanted = f"{repo}@{revision}" if revision else repo
    fetch = f"hf download {repo}{f' --revision {revision}' if revision else ''}"
    missing, unreachable = [], False
    for filename in WEIGHTS:
        try:
            with _quiet_hub():
                path = Path(hf_hub_download(repo, filename, revision=revision, local_files_only=unreachable))
        except LocalEntryNotFoundError:  # neither cached nor fetched: the Hub unreachable (or offline), after its own retries
            missing.append(filename)
            unreachable = True  # the next file from the cache alone: the same retries would fail the same way
            continue
        except GatedRepoError:
            raise ProbeError(
                wanted,
                "is a gated repository whose licence this account has not accepted",
                f"accept the licence on the repository's page, run `hf auth login`, then `{fetch}`",
            ) from None
        except RepositoryNotFoundError:
            raise ProbeError(wanted, "is no Hugging Face repository this account can read", "check the name (org/name), or log in with `hf auth login`") from None
        except RevisionNotFoundError:
            raise ProbeError(wanted, f"has no revision {revision!r}", f"name a branch, tag or commit of {repo} with --revision") from None
        except EntryNotFoundError:
            missing.append(filename)
            continue
        folder = path.parent
        source = {
            "repository": repo,
            "revision": folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else revision or "main",
            "file": filename,
            **_config(_cached(repo, "config.json", revision)),
        }
        source.update(_licence(_cached(repo, "README.md", revision)))
        return Located(path, repo.split("/", 1)[1], source)
    here = "" if prefixed else "is no path here, and "
    raise ProbeError(
        wanted,
        f"{here}has no {' or '.join(missing)} in the Hugging Face cache, and none could be fetched (offline, or no such file)",
        f"where the network allows, run `{fetch}`; then rerun (HF_HUB_OFFLINE=1 reads the cache alone)",
    )


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub's own warnings held back (a line per retry of an unreachable Hub: two dozen
    lines over half a minute offline); what failed is said once, by the caller's one line."""
    import logging

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _cached(repo: str, filename: str, revision: str | None) -> Path | None:
    """A small companion file of the repository, fetched where allowed; None where it cannot be had."""
    from huggingface_hub import hf_hub_download

    try:
        with _quiet_hub():
            return Path(hf_hub_download(repo, filename, revision=revision))
    except Exception:  # a missing model card or config only leaves that field unstated
        return None


def _config(path: Path | None) -> dict[str, Any]:
    """The architecture the folder's config.json names (transformers: architectures / model_type; timm: architecture)."""
    if path is None or not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    named = config.get("architecture") or ", ".join(config.get("architectures") or []) or config.get("model_type")
    return {"config": str(named)} if named else {}


def _licence(readme: Path | None) -> dict[str, Any]:
    """The licence the model card's front matter states (``license``, and ``license_name`` / ``license_link`` for "other")."""
    if readme is None or not readme.is_file():
        return {"licence": None}
    from huggingface_hub.repocard import metadata_load

    try:
        meta = metadata_load(readme) or {}
    except Exception:  # a model card whose front matter does not parse states no licence we can read
        return {"licence": None}
    licence = meta.get("license")
    if licence == "other" and meta.get("license_name"):
        licence = str(meta["license_name"])
    out: dict[str, Any] = {"licence": str(licence) if licence else None}
    if meta.get("license_link"):
        out["licence_link"] = str(meta["license_link"])
    return out

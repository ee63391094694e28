"""Checkpoints by name: a Hugging Face Hub cache the test writes (the real layout), read offline, and transformers folders."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from probe_toolkit.demo.samples import TINY, TINY_DINOV3, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import hub
from probe_toolkit.store.checkpoints import load_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DINOV3_CARD = "---\nlicense: other\nlicense_name: dinov3-license\nlicense_link: https://ai.meta.com/resources/models-and-libraries/dinov3-license\n---\n# a model\n"


def hub_cache(root: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT, ref: str = "main") -> Path:
    """The cache huggingface_hub writes: models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> → blob, refs/<ref>}."""
    org, name = repo.split("/")
    top = root / f"models--{org}--{name}"
    (top / "blobs").mkdir(parents=True, exist_ok=True)
    (top / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (top / "refs").mkdir(exist_ok=True)
    for filename, data in files.items():
        blob = top / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, top / "snapshots" / commit), top / "snapshots" / commit / filename)
    (top / "refs" / ref).write_text(commit)
    return top / "snapshots" / commit


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """huggingface_hub pointed at the test's own cache, offline (its constants are read when it is imported)."""
    from huggingface_hub import constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root


def _same_backbone(a, b) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_timm_hub_name_reads_the_cached_snapshot(tmp_path, offline_cache):
    file = write_checkpoint(tmp_path / "w.safetensors", "dinov3-hf", TINY_DINOV3, seed=3)
    data = file.read_bytes()
    hub_cache(
        offline_cache,
        "timm/vit_tiny_patch16_dinov3.test",
        {"model.safetensors": data, "README.md": DINOV3_CARD.encode(), "config.json": b'{"architecture": "vit_small_patch16_dinov3"}'},
    )
    direct = load_checkpoint(file)
    for name in ("hf-hub:timm/vit_tiny_patch16_dinov3.test", "timm/vit_tiny_patch16_dinov3.test"):
        named = load_checkpoint(name)
        _same_backbone(named.backbone, direct.backbone)
        assert named.sha256 == direct.sha256 == hashlib.sha256(data).hexdigest()
        assert named.stem == "vit_tiny_patch16_dinov3.test"
        assert named.path.parent.name == COMMIT
        assert named.describe()["source"] == {
            "repository": "timm/vit_tiny_patch16_dinov3.test",
            "revision": COMMIT,
            "file": "model.safetensors",
            "config": "vit_small_patch16_dinov3",
            "licence": "dinov3-license",
            "licence_link": "https://ai.meta.com/resources/models-and-libraries/dinov3-license",
        }
    assert "source" not in direct.describe() and direct.stem == "w"


def test_revisions_resolve_to_the_cached_commit_and_a_missing_one_is_one_line(tmp_path, offline_cache):
    data = write_checkpoint(tmp_path / "w.pth", "dino-backbone", TINY).read_bytes()
    hub_cache(offline_cache, "lab/dino-tiny", {"pytorch_model.bin": data}, ref="v1")
    other = "f" * 40
    hub_cache(offline_cache, "lab/dino-tiny", {"pytorch_model.bin": data}, commit=other)  # main → another commit
    assert load_checkpoint("lab/dino-tiny", revision="v1").source["revision"] == COMMIT
    assert load_checkpoint("lab/dino-tiny", revision=COMMIT).source["revision"] == COMMIT
    plain = load_checkpoint("lab/dino-tiny")
    assert plain.source == {"repository": "lab/dino-tiny", "revision": other, "file": "pytorch_model.bin", "licence": None}
    with pytest.raises(ProbeError) as missing:
        load_checkpoint("lab/dino-tiny", revision="v2")
    assert "lab/dino-tiny@v2" in str(missing.value) and "hf download lab/dino-tiny --revision v2" in str(missing.value)


def test_a_name_not_in_the_cache_says_how_to_fetch_it(offline_cache):
    with pytest.raises(ProbeError) as missing:
        load_checkpoint("facebook/dinov3-vits16-pretrain-lvd1689m")
    text = str(missing.value)
    assert "is no path here" in text and "model.safetensors or pytorch_model.bin" in text
    assert "hf download facebook/dinov3-vits16-pretrain-lvd1689m" in text
    with pytest.raises(ProbeError, match="is a path"):
        hub.locate(__file__, revision="main")


def test_an_unreachable_hub_is_one_line_and_one_round_of_retries(tmp_path, monkeypatch):
    """Online but with the Hub unreachable (a refused port here): the first weights file is asked of
    the Hub once (huggingface_hub's own retries), the second of the cache alone, and no retry of
    huggingface_hub's is printed: what failed is the one line."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    nowhere = "http://127.0.0.1:1"  # a refused port: no test reaches the Hub
    monkeypatch.setattr(constants, "ENDPOINT", nowhere)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", nowhere + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda seconds: None)  # its backoff, not waited here
    asked, download = [], huggingface_hub.hf_hub_download

    def spy(repo, filename, **keywords):
        asked.append((filename, keywords.get("local_files_only", False)))
        return download(repo, filename, **keywords, endpoint=nowhere)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    said = []

    class Keep(logging.Handler):  # what huggingface_hub's logger would print (its own handler writes to the terminal)
        def emit(self, record):
            said.append(record.getMessage())

    keep = Keep()
    logging.getLogger("huggingface_hub").addHandler(keep)
    try:
        with pytest.raises(ProbeError, match="none could be fetched"):
            load_checkpoint("facebook/dinov2-small")
    finally:
        logging.getLogger("huggingface_hub").removeHandler(keep)
    assert asked == [("model.safetensors", False), ("pytorch_model.bin", True)]
    assert not [line for line in said if "Retrying" in line or "thrown while requesting" in line], said


def test_a_missing_file_path_stays_a_path():
    assert not hub.is_hub_name("ckpts/dino.pth") and not hub.is_hub_name("/abs/org/name")
    assert hub.is_hub_name("hf-hub:timm/vit_small_patch16_dinov3.lvd1689m") and hub.is_hub_name("facebook/dinov2-small")
    with pytest.raises(ProbeError, match="no such checkpoint file"):
        load_checkpoint("ckpts/dino.pth")


def test_a_transformers_folder_loads_like_its_file(tmp_path):
    folder = tmp_path / "dinov3-vits16"
    file = write_checkpoint(folder / "model.safetensors", "dinov3-hf", TINY_DINOV3, seed=1)
    (folder / "config.json").write_text(json.dumps({"architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit"}))
    (folder / "README.md").write_text(DINOV3_CARD)
    named, direct = load_checkpoint(folder), load_checkpoint(file)
    _same_backbone(named.backbone, direct.backbone)
    assert named.sha256 == direct.sha256 and named.format == direct.format == "dinov3-hf"
    assert named.stem == "dinov3-vits16"
    assert named.source["config"] == "DINOv3ViTModel" and named.source["licence"] == "dinov3-license"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProbeError, match="without model.safetensors"):
        load_checkpoint(empty)


def test_probe_extract_takes_a_hub_name_offline_and_the_manifest_says_where_it_came_from(tmp_path, photos):
    """The command line, in a fresh process: huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE from the environment."""
    root = tmp_path / "hf-cache"
    data = write_checkpoint(tmp_path / "w.safetensors", "dinov3-hf", TINY_DINOV3).read_bytes()
    hub_cache(root, "timm/vit_tiny_patch16_dinov3.test", {"model.safetensors": data, "README.md": DINOV3_CARD.encode()})
    images = tmp_path / "photos"
    images.mkdir()
    for name in ("astronaut.jpg", "coffee.jpg"):
        (images / name).write_bytes((photos / name).read_bytes())
    env = {**os.environ, "HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "probe_toolkit",
            "extract",
            "hf-hub:timm/vit_tiny_patch16_dinov3.test",
            "--images",
            str(images),
            "--views",
            "224",
            "--cache",
            str(tmp_path / "cache"),
            "-q",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    store = tmp_path / "cache" / f"vit_tiny_patch16_dinov3.test-{hashlib.sha256(data).hexdigest()[:8]}" / "teacher.zarr"
    manifest = json.loads((store / "zarr.json").read_text())["attributes"]["manifest"]
    assert manifest["checkpoint"]["source"]["repository"] == "timm/vit_tiny_patch16_dinov3.test"
    assert manifest["checkpoint"]["source"]["licence"] == "dinov3-license"
    assert manifest["checkpoint"]["sha256"] == hashlib.sha256(data).hexdigest()
    # ... and the report's manifest table says so, with no path of this machine
    from probe_toolkit.report.sections import manifests
    from probe_toolkit.report.sources import open_stores

    class Ctx:
        stores = open_stores([store])
        labels = [stores[0].label]

    rows = {row[0]: row[1] for row in manifests(Ctx).blocks[0].rows}
    assert rows["checkpoint source"] == f"timm/vit_tiny_patch16_dinov3.test @ {COMMIT[:12]} (model.safetensors); licence: dinov3-license"
    assert rows["checkpoint"] == "model.safetensors" and not rows["store"].startswith("/")

"""Checkpoint layouts, safe loading, strict keys, conversion: the course's counts and every refusal."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pytest
import torch

from probe_toolkit.demo.samples import LAYOUTS, TINY, make_checkpoint, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.backbone import build_vit
from probe_toolkit.store.checkpoint_files import read_file, sha256_file
from probe_toolkit.store.checkpoints import VIT_S16, convert_backbone, load_checkpoint, parameter_count


def test_course_parameter_counts():
    state = build_vit(VIT_S16, device="meta").state_dict()
    assert len(state) == 150
    assert parameter_count(state) == 21_665_664
    converted = convert_backbone(state)
    assert len(converted) == 147
    assert parameter_count(converted) == 21_664_128
    assert parameter_count(state) - parameter_count(converted) == 1_536
    block = {k: v for k, v in state.items() if k.startswith("blocks.0.")}
    assert parameter_count(block) == 1_774_464
    assert parameter_count({k: v for k, v in state.items() if k.startswith("patch_embed.")}) == 295_296


EXPECTED_FORMAT = {
    "dino-backbone": "dino-backbone",
    "selfpatch-backbone": "selfpatch-backbone",
    "dino-full": "dino-full",
    "selfpatch-full": "selfpatch-full",
    "dino-full-wrapped": "dino-full",
    "selfpatch-backbone-wrapped": "selfpatch-backbone",
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_tiny_layout_loads(tmp_path, layout):
    path = write_checkpoint(tmp_path / "c.pth", layout, TINY, seed=3)
    checkpoint = load_checkpoint(path)
    assert checkpoint.format == EXPECTED_FORMAT[layout]
    selfpatch = layout.startswith("selfpatch")
    assert checkpoint.arch.class_token is (not selfpatch) and checkpoint.arch.final_norm is (not selfpatch)
    assert (checkpoint.arch.width, checkpoint.arch.depth, checkpoint.arch.heads, checkpoint.arch.pos_grid) == (128, 2, 2, 14)
    assert len(checkpoint.backbone) == (2 * 12 + 6 if not selfpatch else 2 * 12 + 3)
    assert not any(k.startswith(("module.", "backbone.")) for k in checkpoint.backbone)
    raw = make_checkpoint(layout, TINY, seed=3)
    raw = raw.get("model", raw.get("state_dict", raw))
    if "teacher" in raw:
        assert torch.equal(checkpoint.backbone["pos_embed"], raw["teacher"]["backbone.pos_embed"])
        student = load_checkpoint(path, network="student")
        assert torch.equal(student.backbone["pos_embed"], raw["student"]["module.backbone.pos_embed"])
        assert not torch.equal(student.backbone["pos_embed"], checkpoint.backbone["pos_embed"])
        assert set(checkpoint.heads) == ({"ca_head", "c_head", "p_head"} if selfpatch else {"head"})
        assert isinstance(checkpoint.extra["args"], dict)


@pytest.mark.parametrize("layout", ["dino-backbone", "selfpatch-full"])
def test_full_size_layouts_load(tmp_path, layout):
    path = write_checkpoint(tmp_path / "big.pth", layout, VIT_S16)
    checkpoint = load_checkpoint(path)
    assert checkpoint.arch.width == 384 and checkpoint.arch.depth == 12 and checkpoint.arch.heads == 6
    expected = 21_665_664 if layout == "dino-backbone" else 21_664_128
    assert parameter_count(checkpoint.backbone) == expected
    if layout == "selfpatch-full":
        assert parameter_count(checkpoint.heads["ca_head"]) == 3_550_080
        assert parameter_count(checkpoint.heads["p_head"]) == 6_562_048
        assert parameter_count(checkpoint.heads["c_head"]) == 22_352_128


def _save(obj, path: Path) -> Path:
    torch.save(obj, path)
    return path


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = make_checkpoint("dino-backbone")
    del state["blocks.1.mlp.fc2.bias"]
    state["blocks.1.extra.weight"] = torch.zeros(3)
    with pytest.raises(ProbeError) as error:
        load_checkpoint(_save(state, tmp_path / "bad.pth"))
    assert "blocks.1.mlp.fc2.bias" in str(error.value) and "blocks.1.extra.weight" in str(error.value)


def test_a_file_checked_before_is_not_checked_again_and_any_other_is(tmp_path, monkeypatch):
    """A store re-reads its checkpoint by the sha256 it was extracted from: those very bytes passed
    the key check (which builds timm's network) then; a file with another digest is checked in
    full and a malformed one refused as before."""
    from probe_toolkit.store import checkpoints

    good = write_checkpoint(tmp_path / "good.pth", "dino-full", TINY, seed=1)
    digest = sha256_file(good)
    calls = []
    real_check = checkpoints.check_backbone
    monkeypatch.setattr(checkpoints, "check_backbone", lambda *a: calls.append(a[2]) or real_check(*a))
    again = load_checkpoint(good, checked_sha256=digest)
    assert calls == [] and again.sha256 == digest
    assert torch.equal(again.backbone["pos_embed"], load_checkpoint(good).backbone["pos_embed"]) and calls == [good]
    state = make_checkpoint("dino-backbone")
    del state["blocks.1.mlp.fc2.bias"]
    bad = _save(state, tmp_path / "bad.pth")
    with pytest.raises(ProbeError, match="blocks.1.mlp.fc2.bias"):
        load_checkpoint(bad, checked_sha256=digest)  # another file under a known name: checked, refused


def test_a_store_refuses_a_checkpoint_replaced_after_extraction(tmp_path):
    from probe_toolkit.store import parts

    path = write_checkpoint(tmp_path / "c.pth", "selfpatch-full", TINY, seed=1)
    manifest = {"checkpoint": {"path": str(path), "sha256": sha256_file(path), "format": "selfpatch-full"}, "network": "teacher", "arch": {"heads": 2}}
    assert parts.aggregation_head(manifest, "store.zarr") is not None
    write_checkpoint(path, "selfpatch-full", TINY, seed=2)  # other weights at the same path
    with pytest.raises(ProbeError, match="sha256 differs"):
        parts.aggregation_head(manifest, "store.zarr")


def test_prefixes_are_stripped_only_as_prefixes(tmp_path):
    full = make_checkpoint("dino-full")
    teacher = full["teacher"]
    # DINO's loader replaces the substring "module." anywhere; a key that only looks right after
    # such a replacement must be refused, not silently accepted
    teacher["backbone.blocks.0.norm1.module.weight"] = teacher.pop("backbone.blocks.0.norm1.weight")
    with pytest.raises(ProbeError, match="norm1"):
        load_checkpoint(_save(full, tmp_path / "p.pth"))


def test_another_architecture_is_refused(tmp_path):
    import torchvision

    resnet = torchvision.models.resnet18().state_dict()
    with pytest.raises(ProbeError, match="not a ViT backbone"):
        load_checkpoint(_save(resnet, tmp_path / "resnet.pth"))


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"teacher": {"x": torch.zeros(1)}, "payload": _RunsCode(str(marker))}, path)
    with pytest.raises(ProbeError, match="refused.*could run code"):
        load_checkpoint(path)
    assert not marker.exists()
    # the payload really runs code when unpickled by plain pickle (the test is not vacuous)
    pickle.loads(pickle.dumps(_RunsCode(str(marker))))
    assert marker.exists()


def test_argparse_namespace_is_allowed(tmp_path):
    path = _save({"args": argparse.Namespace(lr=0.1), "x": torch.ones(1)}, tmp_path / "ns.pth")
    assert read_file(path)["args"].lr == 0.1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b""), "empty"),
        (lambda p: p.write_bytes(b"not a checkpoint at all"), "not a readable PyTorch checkpoint"),
        (lambda p: torch.save({}, p), "holds no state dict"),
        (lambda p: torch.save({"student": make_checkpoint("dino-full")["student"]}, p), "without a 'teacher' entry"),
    ],
)
def test_bad_files_get_one_clear_line(tmp_path, make, message):
    path = tmp_path / "bad.pth"
    make(path)
    with pytest.raises(ProbeError, match=message) as error:
        load_checkpoint(path)
    assert str(path) in error.value.line() and "\n" not in error.value.line()


def test_truncated_file_is_refused(tmp_path, tiny_checkpoints):
    data = tiny_checkpoints["dino-full"].read_bytes()
    path = tmp_path / "cut.pth"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProbeError, match="truncated"):
        load_checkpoint(path)


def test_convert_drops_exactly_the_class_token_parts(tmp_path, tiny_checkpoints):
    from probe_toolkit.store.checkpoints import convert_file

    before, after = convert_file(tiny_checkpoints["dino-full"], tmp_path / "conv.pth")
    assert before - after == 128 + 128 + 2 * 128  # cls_token, pos row 0, norm weight and bias
    converted = load_checkpoint(tmp_path / "conv.pth")
    original = load_checkpoint(tiny_checkpoints["dino-full"])
    assert converted.format == "selfpatch-backbone"
    assert torch.equal(converted.backbone["pos_embed"], original.backbone["pos_embed"][:, 1:])
    assert not pickle.loads(pickle.dumps(converted.arch)).class_token

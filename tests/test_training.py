"""training/: structure (parameter counts, keys), losses against plain reimplementations, the step, runs.

Numbers asserted come from the course (Part 4 §4.5) and ``reference/dino_selfpatch.md``; losses,
schedules and the aggregation module are checked against independent code written here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from probe_toolkit.demo.samples import TINY, make_checkpoint, sample_photos, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoint_layouts import TRAINER_MARK
from probe_toolkit.store.checkpoints import VIT_S16, load_checkpoint
from training import load_config, losses, rules, schedules, state, train
from training.config import ModelCfg, RuleCfg
from training.distributed import Dist
from training.loop import LOG_FIELDS, build_networks, build_trainer, train_step
from training.model import Network, selfpatch_arch

CPU = Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"))

# an independent watcher of file opens (a different code path from training.hygiene)
_opened: list[str] = []
_recording = [False]


def _watch(event, args):
    if event == "open" and _recording[0] and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.path.abspath(os.fsdecode(args[0])))


sys.addaudithook(_watch)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------
# structure at ViT-S/16 (meta device: no memory)


def test_parameter_counts_at_vit_s16():
    with torch.device("meta"):
        net = Network(selfpatch_arch(VIT_S16), ModelCfg())
    count = lambda params: sum(p.numel() for p in params)  # noqa: E731
    assert count(net.parameters()) == 54_128_384
    assert count(p for p in net.parameters() if p.requires_grad) == 54_058_752
    # the aggregation module, from its parts: query, 2 × (2 norms, q/k/v/proj, MLP), final norm
    d, h = 384, 1536
    block = 2 * 2 * d + 4 * (d * d + d) + (d * h + h) + (h * d + d)
    assert count(net.ca_head.parameters()) == d + 2 * block + 2 * d == 3_550_080
    assert count(net.p_head.last_layer.parameters()) == 4096 * 256 + 4096 == 1_052_672
    assert count(net.c_head.last_layer.parameters()) == 65536 * 256 + 65536 == 16_842_752
    assert count(net.backbone.parameters()) == 21_664_128
    released = state.released_names(net.state_dict())
    assert len(released) == 198  # teacher keys of SelfPatch's checkpoint: 147 + 35 + 8 + 8
    assert released["c_head.last_layer.weight_g"].shape == (65536, 1) and released["p_head.last_layer.weight_v"].shape == (4096, 256)


def test_saved_names_are_selfpatch_keys():
    """The released layout (written independently by probe_toolkit.demo.samples) has exactly our keys and shapes."""
    cfg = load_config("tiny")
    student, teacher, _ = build_networks(cfg)
    ours = state.released_names(teacher.state_dict())
    theirs = make_checkpoint("selfpatch-full", TINY)["teacher"]
    assert len(ours) == (3 + 12 * 2) + 35 + 8 + 8
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert state.network_names(ours).keys() == teacher.state_dict().keys()


# ----------------------------------------------------------------------------------------------
# the aggregation module against SelfPatch's forward, written plainly


def plain_window(grid):
    """SelfPatch's get_local_index: 3×3 window, offsets modulo the side, centre removed, ascending."""
    out = []
    for i in range(grid * grid):
        r, c = divmod(i, grid)
        cells = {((r + dr) % grid) * grid + (c + dc) % grid for dr in (-1, 0, 1) for dc in (-1, 0, 1)} - {i}
        out.append(sorted(cells))
    return torch.tensor(out)


def plain_class_attention(block, x, cls):
    heads = block.attn.heads
    u = torch.cat([cls, x], 1)
    u = F.layer_norm(u, u.shape[-1:], block.norm1.weight, block.norm1.bias, 1e-6)
    m, t, d = u.shape
    q = (u[:, :1] @ block.attn.q.weight.T + block.attn.q.bias).reshape(m, 1, heads, -1).transpose(1, 2) * (d // heads) ** -0.5
    k = (u @ block.attn.k.weight.T + block.attn.k.bias).reshape(m, t, heads, -1).transpose(1, 2)
    v = (u @ block.attn.v.weight.T + block.attn.v.bias).reshape(m, t, heads, -1).transpose(1, 2)
    a = (q @ k.transpose(-2, -1)).softmax(-1)
    cls = cls + ((a @ v).transpose(1, 2).reshape(m, 1, d) @ block.attn.proj.weight.T + block.attn.proj.bias)
    z = F.layer_norm(cls, cls.shape[-1:], block.norm2.weight, block.norm2.bias, 1e-6)
    return cls + (F.gelu(z @ block.mlp.fc1.weight.T + block.mlp.fc1.bias) @ block.mlp.fc2.weight.T + block.mlp.fc2.bias)


def test_teacher_patch_targets_match_selfpatch_forward():
    torch.manual_seed(0)
    cfg = load_config("tiny")
    net, _, _ = build_networks(cfg)
    ca = net.ca_head
    x = torch.randn(2, 36, 128)
    sel = rules.select(x, RuleCfg(name="selfpatch"))
    ours = ca(x, sel.positive)
    with torch.no_grad():
        table = plain_window(6)
        unit = F.normalize(x, dim=-1)
        sims = torch.einsum("bnd,bnkd->bnk", unit, unit[:, table])
        top = sims.topk(4, dim=-1).indices
        sets = x[:, table].reshape(-1, 8, 128).gather(1, top.reshape(-1, 4, 1).expand(-1, -1, 128))
        glo = ca.cls_token.expand(2, -1, -1)
        loc = ca.cls_token.expand(2 * 36, -1, -1)
        for block in ca.cls_blocks:
            glo = plain_class_attention(block, x, glo)
            loc = plain_class_attention(block, sets, loc)
        expected = F.layer_norm(torch.cat([glo, loc.reshape(2, 36, 128)], 1), (128,), ca.norm.weight, ca.norm.bias, 1e-6)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    # the student's patch part is just the final norm of its own tokens
    torch.testing.assert_close(ca(x)[:, 1:], F.layer_norm(x, (128,), ca.norm.weight, ca.norm.bias, 1e-6))


# ----------------------------------------------------------------------------------------------
# losses and schedules against plain code


def plain_ce(q, s, temp):
    return -(q * (s / temp - torch.logsumexp(s / temp, -1, keepdim=True))).sum(-1)


def test_image_and_patch_losses_and_centres():
    torch.manual_seed(1)
    loss = losses.CentredLoss(32, 16, teacher_temp=0.04, student_temp=0.1, center_momentum=0.9)
    loss.center.normal_()
    loss.patch_center.normal_()
    center, patch_center = loss.center.clone(), loss.patch_center.clone()
    student = [torch.randn(3, 32) for _ in range(10)]
    teacher = [torch.randn(3, 32) for _ in range(10)]
    got = loss.image(student, teacher)
    terms = []
    for iq in range(2):
        q = torch.softmax((teacher[iq] - center[0]) / 0.04, -1)
        terms += [plain_ce(q, student[v], 0.1).mean() for v in range(10) if v != iq]
    assert len(terms) == 18
    torch.testing.assert_close(got, torch.stack(terms).mean())

    sp = [torch.randn(3, 5, 16) for _ in range(10)]
    tp = [torch.randn(3, 5, 16) for _ in range(10)]
    used = [torch.rand(3, 5) > 0.3 for _ in range(10)]
    got = loss.patch(sp, tp, used)
    per_crop = [plain_ce(torch.softmax((t - patch_center) / 0.04, -1), s, 0.1)[u].mean() for s, t, u in zip(sp, tp, used)]
    torch.testing.assert_close(got, torch.stack(per_crop).mean())

    loss.update_centres()
    torch.testing.assert_close(loss.center, 0.9 * center + 0.1 * torch.cat(teacher).mean(0))
    used_rows = torch.cat([t[u] for t, u in zip(tp, used)])
    torch.testing.assert_close(loss.patch_center, 0.9 * patch_center + 0.1 * used_rows.mean(0, keepdim=True))
    assert set(loss.state_dict()) == {"center", "patch_center"}
    assert loss.center.shape == (1, 1, 32) and loss.patch_center.shape == (1, 16)


def test_contrastive_loss_uses_the_rule_sets():
    """Hand-made tokens with exact cosines; the loss is checked against a plain loop over the rule's sets.

    Patches 0-3 point along e1, 4-7 along e2, 8-11 along -e1: cosines 1 within a group, -1
    between the first and last group, 0 otherwise. Of the 66 pairs, 16 are -1, so the 20th
    percentile (position 13) is -1: the negatives of a patch in one outer group are the other
    outer group; the middle group has none.
    """
    n = 12
    e1, e2 = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    tokens = torch.stack([e1] * 4 + [e2] * 4 + [-e1] * 4)[None]
    sets = rules.select(tokens, RuleCfg(name="contrastive", k=2, negative_quantile=0.2, max_negatives=48))
    valid_negatives = lambda i: sorted(sets.negative[0, i][sets.negative_valid[0, i]].tolist())  # noqa: E731
    assert sets.positive[0, 0].tolist() == [1, 2] and valid_negatives(0) == [8, 9, 10, 11]
    assert sets.positive[0, 5].tolist() == [4, 6] and valid_negatives(5) == []
    assert sets.positive[0, 9].tolist() == [8, 10] and valid_negatives(9) == [0, 1, 2, 3]
    torch.manual_seed(2)
    student = F.normalize(torch.randn(1, n, 8), dim=-1)
    teacher = F.normalize(torch.randn(1, n, 8), dim=-1)
    got = losses.contrastive(student, teacher, sets, temperature=0.2)
    values = []
    for i in range(n):
        negs = [int(j) for j, ok in zip(sets.negative[0, i], sets.negative_valid[0, i]) if ok]
        for p in sets.positive[0, i].tolist():
            pos = float(student[0, i] @ teacher[0, p]) / 0.2
            neg = [float(student[0, i] @ teacher[0, j]) / 0.2 for j in negs]
            values.append(-pos + math.log(math.exp(pos) + sum(math.exp(v) for v in neg)))
    assert float(got) == pytest.approx(float(np.mean(values)), rel=1e-5)


def plain_cosine_scheduler(base, final, epochs, per_epoch, warmup_epochs=0):
    """DINO's utils.cosine_scheduler."""
    warmup = np.linspace(0, base, warmup_epochs * per_epoch) if warmup_epochs else np.array([])
    iters = np.arange(epochs * per_epoch - warmup_epochs * per_epoch)
    return np.concatenate((warmup, final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))))


def test_schedules_follow_dino():
    lr = plain_cosine_scheduler(1e-4, 1e-6, 20, 7, warmup_epochs=10)
    wd = plain_cosine_scheduler(0.04, 0.4, 20, 7)
    m = plain_cosine_scheduler(0.996, 1.0, 20, 7)
    for step in range(140):
        assert schedules.learning_rate(step, 140, 70, 1e-4, 1e-6) == pytest.approx(lr[step], rel=1e-12, abs=1e-15)
        assert schedules.weight_decay(step, 140, 0.04, 0.4) == pytest.approx(wd[step], rel=1e-12)
        assert schedules.teacher_momentum(step, 140, 0.996) == pytest.approx(m[step], rel=1e-12)


@pytest.mark.parametrize("warmup_epochs", [0, 1, 2, 30])
def test_teacher_temperature_warms_up_per_epoch_as_dino(warmup_epochs):
    """DINOLoss.teacher_temp_schedule (main_dino.py, main_selfpatch.py), written out with numpy."""
    epochs = 40
    plain = np.concatenate((np.linspace(0.04, 0.07, warmup_epochs), np.ones(epochs - warmup_epochs) * 0.07))
    assert [schedules.teacher_temperature(e, warmup_epochs, 0.04, 0.07) for e in range(epochs)] == plain.tolist()  # exactly


def test_a_step_uses_its_epochs_teacher_temperature():
    """The targets are sharpened with the epoch's temperature: a warm-up run's step equals, loss for
    loss, the step of a run held at that temperature, and the log says which it was."""
    sets = {"optim.warmup_epochs": 0, "loss.teacher_temp": 0.07, "loss.warmup_teacher_temp": 0.04, "loss.warmup_teacher_temp_epochs": 3}

    def step(epoch, **more):
        torch.manual_seed(0)
        return train_step(trainer(**{**sets, **more}), fixed_batch(), step=0, epoch=epoch)

    records = {e: step(e) for e in (0, 1, 5)}
    assert [records[e]["teacher_temp"] for e in (0, 1, 5)] == [0.04, np.linspace(0.04, 0.07, 3)[1], 0.07]
    held = {e: step(e, **{"loss.warmup_teacher_temp_epochs": 0, "loss.teacher_temp": records[e]["teacher_temp"]}) for e in (0, 5)}
    for e in (0, 5):
        assert records[e]["loss"] == held[e]["loss"] and records[e]["loss_patch"] == held[e]["loss_patch"]
    assert records[0]["loss_image"] != records[5]["loss_image"]
    with pytest.raises(ProbeError, match="warmup_teacher_temp_epochs"):
        load_config("tiny", {"loss.warmup_teacher_temp_epochs": 100})


# ----------------------------------------------------------------------------------------------
# the step, on a fixed synthetic batch


def fixed_batch(micro=2, accumulation=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(micro, 3, 224, 224, generator=g) for _ in range(2)] + [torch.randn(micro, 3, 96, 96, generator=g) for _ in range(8)] for _ in range(accumulation)
    ]


def trainer(steps_per_epoch=1, **sets):
    cfg = load_config("tiny", {"data.images": "unused", **sets})
    t, _ = build_trainer(cfg, CPU, steps_per_epoch)
    return t


def test_ema_update_is_exact():
    t = trainer(**{"optim.warmup_epochs": 0})
    before = [p.detach().clone() for p in t.teacher.parameters()]
    record = train_step(t, fixed_batch(), step=0, epoch=0)
    m = schedules.teacher_momentum(0, t.total_steps, 0.996)
    assert record["momentum"] == m
    moved = 0
    for old, new, s in zip(before, t.teacher.parameters(), t.student.parameters()):
        torch.testing.assert_close(new, old * m + (1 - m) * s.detach(), rtol=1e-6, atol=1e-9)
        moved += int(not torch.equal(new, old))
    assert moved > 0


def test_last_layer_frozen_in_first_epoch():
    t = trainer(steps_per_epoch=2, **{"optim.warmup_epochs": 0, "optim.freeze_last_layer": 1, "optim.epochs": 4})
    last = lambda: [p.detach().clone() for n, p in t.student.named_parameters() if ".last_layer." in f".{n}"]  # noqa: E731
    mlp = lambda: t.student.c_head.mlp[0].weight.detach().clone()  # noqa: E731
    start_last, start_mlp = last(), mlp()
    batch = fixed_batch()
    for step in range(2):  # epoch 1
        record = train_step(t, batch, step=step, epoch=0)
        assert record["last_layer_frozen"]
    assert all(torch.equal(a, b) for a, b in zip(start_last, last()))
    assert not torch.equal(start_mlp, mlp())
    record = train_step(t, batch, step=2, epoch=1)
    assert not record["last_layer_frozen"]
    assert not all(torch.equal(a, b) for a, b in zip(start_last, last()))


def test_loss_decreases_on_a_fixed_batch():
    t = trainer(**{"optim.warmup_epochs": 0, "optim.freeze_last_layer": 0, "optim.epochs": 1000, "optim.lr_backbone": 1e-3, "optim.lr_heads": 1e-3})
    batch = fixed_batch(seed=3)
    history = [train_step(t, batch, step=s, epoch=0)["loss"] for s in range(6)]
    assert history[-1] < history[0]


@pytest.mark.parametrize("rule", ["threshold", "contrastive", "none"])
def test_other_rules_step(rule):
    t = trainer(**{"rule.name": rule, "optim.warmup_epochs": 0})
    record = train_step(t, fixed_batch(), step=0, epoch=0)
    assert math.isfinite(record["loss"])
    expected = {"threshold": {"loss_patch", "theta", "anchors_without_positive"}, "contrastive": {"loss_contrastive", "negatives_per_anchor"}, "none": set()}[rule]
    assert expected <= set(record) <= set(LOG_FIELDS)
    if rule == "threshold":  # batch median: half of the window links pass, so 4 per anchor on average
        assert 3.0 < record["positives_per_anchor"] < 5.0
    if rule == "none":
        assert record["loss"] == record["loss_image"]


# ----------------------------------------------------------------------------------------------
# runs: checkpoint layout, round trip through probe extract's loader, resume, label hygiene


@pytest.fixture(scope="module")
def train_photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    folder = root / "train"
    folder.mkdir()
    for name in ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"):
        shutil.copy(sample_photos() / name, folder / name)
    (root / "annotations").mkdir()
    (root / "annotations" / "instances_train.json").write_text('{"annotations": []}')
    (folder / "labels.json").write_text("{}")  # not an image: never listed, never opened
    return folder


@pytest.fixture(scope="module")
def tiny_run(train_photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "a"
    config = out.parent / "tiny.toml"
    shutil.copy(Path(__file__).parents[1] / "training" / "configs" / "tiny.toml", config)
    _opened.clear()
    _recording[0] = True
    try:
        run = train(config, {"data.images": str(train_photos), "run.out": str(out), "optim.epochs": 2, "save.every": 1})
    finally:
        _recording[0] = False
    return run, config, list(_opened)


def test_run_writes_the_full_layout(tiny_run):
    run, _, _ = tiny_run
    raw = torch.load(run.checkpoint, map_location="cpu", weights_only=True)  # plain data only, no allow-list
    assert {"student", "teacher", "optimizer", "epoch", "step", "args", "dino_loss", "rng"} <= set(raw)
    assert raw["epoch"] == 2 and raw["step"] == 2 and raw["args"]["trainer"] == TRAINER_MARK
    assert all(k.startswith("module.") for k in raw["student"])
    assert {k[len("module.") :] for k in raw["student"]} == set(raw["teacher"])
    for prefix, count in (("backbone.", 3 + 12 * 2), ("ca_head.", 35), ("c_head.", 8), ("p_head.", 8)):
        assert sum(k.startswith(prefix) for k in raw["teacher"]) == count
    assert raw["teacher"]["c_head.last_layer.weight_g"].shape == (256, 1)
    assert raw["dino_loss"]["center"].shape == (1, 1, 256) and raw["dino_loss"]["patch_center"].shape == (1, 64)
    assert [g["name"] for g in raw["optimizer"]["param_groups"]] == ["backbone/decay", "backbone/no_decay", "heads/decay", "heads/no_decay"]
    assert (run.dir / "checkpoint0001.pth").exists() and (run.dir / "checkpoint0002.pth").exists()
    lines = [json.loads(line) for line in run.log.read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]
    assert {"loss", "loss_image", "loss_patch", "lr_backbone", "lr_heads", "momentum", "step_time_s", "images_per_s"} <= set(lines[0])
    manifest = json.loads(run.manifest.read_text())
    assert manifest["status"] == "finished" and len(set(manifest["replicas"]["student"])) == 1


def test_checkpoint_round_trips_through_the_toolkit_loader(tiny_run):
    run, _, _ = tiny_run
    raw = torch.load(run.checkpoint, map_location="cpu", weights_only=True)
    cfg = load_config("tiny")
    x = torch.randn(2, 3, 224, 224)
    for network in ("teacher", "student"):
        checkpoint = load_checkpoint(run.checkpoint, network=network)
        assert checkpoint.format == TRAINER_MARK
        assert not checkpoint.arch.class_token and not checkpoint.arch.final_norm and checkpoint.arch.width == 128
        assert set(checkpoint.heads) == {"ca_head", "c_head", "p_head"}
        ours = Network(checkpoint.arch, cfg.model)
        entry = {k.removeprefix("module."): v for k, v in raw[network].items()}
        state.load_strict(ours, state.network_names(entry), run.checkpoint)
        with torch.no_grad():
            tokens = Backbone.from_checkpoint(checkpoint).readout(x, keys=False, attention="none").tokens
            torch.testing.assert_close(tokens, ours.eval().backbone(x))


def test_resume_continues_the_same_trajectory(tiny_run, train_photos, tmp_path):
    run, config, _ = tiny_run
    resumed = tmp_path / "b"
    resumed.mkdir()
    shutil.copy(run.dir / "checkpoint0001.pth", resumed / "checkpoint.pth")
    again = train(config, {"data.images": str(train_photos), "run.out": str(resumed), "optim.epochs": 2, "save.every": 1})
    first = [json.loads(line) for line in run.log.read_text().splitlines()]
    second = [json.loads(line) for line in again.log.read_text().splitlines()]
    assert [r["step"] for r in second] == [1]
    for key in ("loss", "loss_image", "loss_patch", "lr_backbone", "lr_heads", "momentum", "weight_decay", "grad_norm"):
        assert second[0][key] == pytest.approx(first[1][key], rel=1e-6, abs=1e-9), key
    a = torch.load(run.checkpoint, weights_only=True)
    b = torch.load(again.checkpoint, weights_only=True)
    for network in ("student", "teacher"):
        for key, value in a[network].items():
            torch.testing.assert_close(b[network][key], value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b["dino_loss"]["center"], a["dino_loss"]["center"])
    assert json.loads(again.manifest.read_text())["resumed_from"]["rng"] == "restored"


def test_resume_refuses_other_settings(tiny_run, train_photos, tmp_path):
    run, config, _ = tiny_run
    shutil.copy(run.dir / "checkpoint0001.pth", tmp_path / "checkpoint.pth")
    with pytest.raises(ProbeError, match="other settings"):
        train(config, {"data.images": str(train_photos), "run.out": str(tmp_path), "optim.epochs": 3, "save.every": 1})


def test_only_images_config_and_checkpoints_are_opened(tiny_run, train_photos):
    run, config, opened = tiny_run
    images = {str(p.resolve()) for p in train_photos.iterdir() if p.suffix == ".jpg"}
    system = tuple(os.path.join(os.path.abspath(p), "") for p in {sys.prefix, sys.base_prefix}) + ("/proc/", "/sys/", "/dev/", "/etc/", "/usr/")
    data = [p for p in opened if not p.startswith(system) and not p.endswith((".py", ".pyc", ".so"))]
    assert data, "the watcher saw nothing"
    for path in data:
        assert path in images or path == str(config.resolve()) or path.startswith(str(run.dir) + os.sep), path
    assert images <= set(data)
    assert not any(p.endswith(".json") and not p.startswith(str(run.dir)) for p in opened)
    hygiene = json.loads(run.manifest.read_text())["label_hygiene"]
    assert hygiene["no_annotation_opened"] and hygiene["other_files_opened"] == []
    assert hygiene["n_images"] == 4 and len(hygiene["image_list_sha256"]) == 64


# ----------------------------------------------------------------------------------------------
# starting from released layouts; configs; command lines


def test_init_from_selfpatch_full_loads_heads_and_from_dino_converts(tmp_path):
    path = write_checkpoint(tmp_path / "sp.pth", "selfpatch-full", TINY)
    cfg = load_config("tiny", {"init.checkpoint": str(path)})
    student, teacher, info = build_networks(cfg)
    released = make_checkpoint("selfpatch-full", TINY)["teacher"]
    assert info["format"] == "selfpatch-full" and info["loaded"] == ["backbone", "ca_head", "c_head", "p_head"]
    ours = state.released_names(student.state_dict())
    for key in ("c_head.last_layer.weight_v", "ca_head.cls_token", "p_head.mlp.4.weight", "backbone.pos_embed"):
        assert torch.equal(ours[key], released[key]), key
    assert all(torch.equal(a, b) for a, b in zip(student.state_dict().values(), teacher.state_dict().values()))

    path = write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY)
    cfg = load_config("tiny", {"init.checkpoint": str(path)})
    student, _, info = build_networks(cfg)
    released = make_checkpoint("dino-full", TINY)["teacher"]
    assert info["converted"] and info["loaded"] == ["backbone"]
    assert torch.equal(student.backbone.vit.pos_embed, released["backbone.pos_embed"][:, 1:])


def test_a_start_from_a_file_with_heads_takes_its_teacher_centres(tmp_path):
    """SelfPatch's and DINO's resume puts the file's centres back: a run continued from a released
    file starts from them, not from zero targets; a head not taken keeps a zero centre."""
    from probe_toolkit.store.checkpoint_files import save_state

    raw = make_checkpoint("selfpatch-full", TINY)
    g = torch.Generator().manual_seed(3)
    raw["dino_loss"] = {k: torch.randn(v.shape, generator=g) for k, v in raw["dino_loss"].items()}
    path = save_state(raw, tmp_path / "sp.pth")
    t, info = build_trainer(load_config("tiny", {"init.checkpoint": str(path)}), CPU, 4)
    assert info["centres"] == ["center", "patch_center"]
    assert torch.equal(t.loss.center, raw["dino_loss"]["center"]) and torch.equal(t.loss.patch_center, raw["dino_loss"]["patch_center"])
    t, info = build_trainer(load_config("tiny", {"init.checkpoint": str(path), "init.heads": False}), CPU, 4)
    assert info["centres"] == [] and not t.loss.center.any() and not t.loss.patch_center.any()
    t, info = build_trainer(load_config("tiny", {"init.checkpoint": str(write_checkpoint(tmp_path / "d.pth", "dino-full", TINY))}), CPU, 4)
    assert info["centres"] == [] and not t.loss.center.any()  # DINO's head is not SelfPatch's c_head


def test_random_prototype_directions_keep_nn_linear_default():
    """DINO and SelfPatch apply trunc-normal(0.02) before the weight-normed last layer is made, so its
    directions v keep nn.Linear's Kaiming-uniform U(-1/sqrt(fan_in), 1/sqrt(fan_in)); lengths g are 1."""
    torch.manual_seed(0)
    net, _, _ = build_networks(load_config("tiny"))
    for head in (net.c_head, net.p_head):
        weight = head.last_layer.parametrizations.weight
        v, bound = weight.original1, 1 / math.sqrt(weight.original1.shape[1])
        assert v.abs().max() <= bound and v.abs().max() > 0.98 * bound
        assert v.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)  # a uniform's std, not 0.02
        assert torch.equal(weight.original0, torch.ones_like(weight.original0))


def test_configs_load_and_bad_settings_are_named():
    for name in ("selfpatch", "contrastive", "dino", "tiny"):
        load_config(name)
    sp = load_config("selfpatch")
    assert (sp.rule.name, sp.rule.k, sp.rule.weight, sp.loss.teacher_temp, sp.loss.student_temp) == ("selfpatch", 4, 0.1, 0.04, 0.1)
    assert (sp.optim.batch_size, sp.optim.micro_batch, sp.optim.lr_backbone, sp.optim.lr_heads, sp.optim.clip_grad) == (256, 32, 1e-5, 1e-4, 3.0)
    assert load_config("contrastive").rule.temperature == 0.2
    assert load_config("tiny", ["optim.epochs=7", "data.global_scale=[0.3, 1.0]"]).optim.epochs == 7
    with pytest.raises(ProbeError, match="unknown key optim.epoch") as refused:
        load_config("tiny", ["optim.epoch=2"])
    assert refused.value.where == "--set"  # the override, not the config file, holds the key
    with pytest.raises(ProbeError, match="is not a int"):
        load_config("tiny", ["optim.epochs=two"])


def test_command_lines(train_photos, tmp_path, capsys):
    from training.__main__ import main

    assert main(["tiny", "--quiet"]) == 2  # no image folder
    assert "data.images" in capsys.readouterr().err

    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    result = CliRunner().invoke(
        app, ["train", "tiny", "--set", f"data.images={train_photos}", "--set", f"run.out={tmp_path / 'cli'}", "--set", "optim.epochs=1", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "checkpoint.pth").exists()
    assert '"micro_batch": 2' in result.output  # the resolved config is printed


class _Reads(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 1

    def __getitem__(self, index):
        with open(self.path) as handle:
            return len(handle.read())


def test_open_watch_reports_files_read_in_loader_workers(tmp_path):
    from training import hygiene

    decoy = tmp_path / "instances_val.json"
    decoy.write_text("{}")
    (tmp_path / "run").mkdir()
    watch = hygiene.Watch(run_dir=str(tmp_path / "run"), images=frozenset())
    with watch:
        loader = torch.utils.data.DataLoader(_Reads(decoy), num_workers=1, worker_init_fn=watch.worker_init)
        assert [int(x) for x in loader] == [2]
    assert watch.other == []  # the main process opened nothing of the kind
    summary = hygiene.summary(watch, "0" * 64, 0)
    assert summary["other_files_opened"] == [str(decoy)] and not summary["no_annotation_opened"]


def test_window_without_wrap_masks_missing_candidates():
    """Without the wrap a corner anchor has 3 candidates: the 4th slot is padding and must not enter its target."""
    torch.manual_seed(4)
    cfg = load_config("tiny")
    net, _, _ = build_networks(cfg)
    x = torch.randn(1, 36, 128)
    sel = rules.select(x, RuleCfg(name="selfpatch", wrap=False))
    assert sel.positive_valid[0, 0].sum() == 3 and sel.positive_valid[0, 14].all()
    with torch.no_grad():
        masked = net.ca_head(x, sel.positive, sel.positive_valid)[0, 1:]
        corner = net.ca_head.summarise(x[:, sel.positive[0, 0][sel.positive_valid[0, 0]]])
    torch.testing.assert_close(masked[0], net.ca_head.norm(corner)[0], rtol=1e-5, atol=1e-6)
    t = trainer(**{"rule.wrap": False, "optim.warmup_epochs": 0})
    assert math.isfinite(train_step(t, fixed_batch(), step=0, epoch=0)["loss"])


def test_a_bad_image_folder_is_one_line_naming_the_config_key_before_any_file(tmp_path, capsys):
    """probe train takes its photographs from ``data.images`` (a config key): a folder that is none,
    or holds no image, is refused in one line whose fix names that key, before the config is echoed
    and before the run folder is made."""
    from cli_runs import probe_main

    (tmp_path / "empty").mkdir()
    fix = "set data.images to a folder of photographs, in the config or with --set data.images=DIR"
    kinds = " (.bmp, .gif, .jpeg, .jpg, .pbm, .pgm, .png, .ppm, .tif, .tiff, .webp)"
    for folder, said in ((tmp_path / "nothere", "is not a folder"), (tmp_path / "empty", f"holds no images{kinds}")):
        out = tmp_path / "runs" / folder.name
        code, printed = probe_main(["train", "tiny", "--set", f"data.images={folder}", "--set", f"run.out={out}", "--quiet"], capsys)
        assert code == 2 and printed.out == "" and printed.err.strip() == f"error: {folder}: {said}; {fix}", printed
        assert not (tmp_path / "runs").exists()
    code, printed = probe_main(["train", "tiny", "--set", "data.imagez=x"], capsys)
    assert code == 2 and "--set: unknown key data.imagez" in printed.err

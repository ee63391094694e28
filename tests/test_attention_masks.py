"""``probe attention-masks``: DINO's 60 % masks and their Jaccard against plain loops written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runs import probe_main
from pycocotools import mask as mask_utils
from typer.testing import CliRunner

from probe_toolkit.analyses import attention_masks as am
from probe_toolkit.cli import app
from probe_toolkit.labels import ledger
from probe_toolkit.results import records
from probe_toolkit.store import cache, images
from probe_toolkit.store.checkpoints import load_checkpoint

runner = CliRunner()


def plain_mask(row, mass):
    """One head: sort ascending (ties in grid order), running share, keep past 1 − mass."""
    row = [float(v) for v in row]
    total = sum(row)
    order = sorted(range(len(row)), key=lambda i: (row[i], i))
    keep, running = [False] * len(row), 0.0
    for i in order:
        running += row[i] / total
        keep[i] = running > 1.0 - mass
    return np.array(keep)


def plain_iou(head_mask, grid, patch, obj):
    """IoU of a patch mask, upsampled pixel by pixel, with a pixel mask."""
    inter = union = 0
    for y in range(obj.shape[0]):
        for x in range(obj.shape[1]):
            m = bool(head_mask[(y // patch) * grid + x // patch])
            inter += m and obj[y, x]
            union += m or obj[y, x]
    return inter / union if union else 0.0


def test_masks_and_jaccard_equal_plain_loops():
    rng = np.random.default_rng(0)
    grid, patch, heads = 5, 4, 3
    logits = rng.normal(0, 2, (heads, 1 + grid * grid, 1 + grid * grid))
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    rows = am.class_rows(attention)
    masks = am.mass_masks(rows, 0.6)
    for h in range(heads):
        np.testing.assert_array_equal(masks[h], plain_mask(attention[h, 0, 1:], 0.6))
        kept = rows[h][masks[h]].sum()
        assert kept > 0.6 - 1e-12 and kept - rows[h][masks[h]].min() <= 0.6 + 1e-12  # the smallest such set
    objects = np.zeros((2, grid * patch, grid * patch), bool)
    objects[0, 2:11, 3:13] = True
    objects[1, 12:20, 0:7] = True
    score = am.jaccard(am.upsample(masks, grid, grid, patch), objects)
    union = objects.any(0)
    for h in range(heads):
        assert score.union[h] == pytest.approx(plain_iou(masks[h], grid, patch, union))
    per_object = np.mean([max(plain_iou(masks[h], grid, patch, o) for h in range(heads)) for o in objects])
    assert score.per_object == pytest.approx(per_object)
    assert score.best_union == pytest.approx(max(plain_iou(masks[h], grid, patch, union) for h in range(heads)))
    # ties: a flat row keeps the last 60 % of the patches in grid order
    flat = am.mass_masks(np.ones(10), 0.6)
    np.testing.assert_array_equal(flat, plain_mask(np.ones(10), 0.6))


def plain_class_attention(tokens, head, heads):
    """SelfPatch's class-attention blocks, one head at a time in float64 (the last block's weights)."""
    t = tokens.astype(np.float64)
    g = {k: v.double().numpy() for k, v in head.items()}
    d = t.shape[-1]
    dh = d // heads

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-6) * g[p + ".weight"] + g[p + ".bias"]

    def lin(x, p):
        return x @ g[p + ".weight"].T + g[p + ".bias"]

    c = g["cls_token"][0]  # (1, d)
    weights = None
    for i in (0, 1):
        p = f"cls_blocks.{i}."
        u = ln(np.concatenate([c, t]), p + "norm1")
        q, k, v = lin(u[:1], p + "attn.q"), lin(u, p + "attn.k"), lin(u, p + "attn.v")
        out = np.zeros((1, d))
        weights = np.zeros((heads, len(u)))
        for h in range(heads):
            s = slice(h * dh, (h + 1) * dh)
            a = (q[:, s] * dh**-0.5) @ k[:, s].T
            a = np.exp(a - a.max())
            a /= a.sum()
            weights[h] = a[0]
            out[:, s] = a @ v[:, s]
        c = c + lin(out, p + "attn.proj")
        hidden = lin(ln(c, p + "norm2"), p + "mlp.fc1")
        c = c + lin(0.5 * hidden * (1 + np.vectorize(__import__("math").erf)(hidden / np.sqrt(2))), p + "mlp.fc2")
    rows = weights[:, 1:]
    return rows / rows.sum(-1, keepdims=True)


def test_aggregation_head_rows_equal_a_plain_float64_loop(tiny_checkpoints):
    ck = load_checkpoint(tiny_checkpoints["selfpatch-full"])
    head = {k: v.float() for k, v in ck.heads["ca_head"].items()}
    tokens = np.random.default_rng(1).normal(size=(2, 9, ck.arch.width)).astype(np.float32)
    rows = am.aggregation_rows(tokens, head, ck.arch.heads)
    for i in range(2):
        np.testing.assert_allclose(rows[i], plain_class_attention(tokens[i], head, ck.arch.heads), atol=1e-5)


@pytest.fixture(scope="module")
def scene_panel(image_dir, tmp_path_factory):
    """A COCO file for the two synthetic scenes of ``image_dir`` (their exact boxes) and a cache with it registered."""
    root = tmp_path_factory.mktemp("masks")
    boxes = {"scenes/one.png": (640, 480, [(160, 120, 400, 360)]), "scenes/two.png": (480, 480, [(32, 32, 176, 176), (304, 304, 448, 448)])}
    imgs, anns = [], []
    for n, (name, (w, h, bs)) in enumerate(boxes.items(), 1):
        imgs.append({"id": n, "file_name": name, "width": w, "height": h})
        for x0, y0, x1, y1 in bs:
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": n,
                    "category_id": 1,
                    "iscrowd": 0,
                    "area": (x1 - x0) * (y1 - y0),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                }
            )
    path = root / "scenes.json"
    path.write_text(json.dumps({"images": imgs, "annotations": anns, "categories": [{"id": 1, "name": "box"}]}))
    r = runner.invoke(app, ["panel", "add", "scenes", "--annotations", str(path), "--images", str(image_dir), "--role", "val", "--cache", str(root / "cache")])
    assert r.exit_code == 0, r.output
    return root / "cache", boxes


def test_command_scores_the_class_token_masks(tiny_stores, scene_panel, tmp_path):
    c, boxes = scene_panel
    out = tmp_path / "m.json"
    r = runner.invoke(app, ["attention-masks", str(tiny_stores["dino"]), "--panel", "scenes", "--cache", str(c), "--json", str(out), "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(out.read_text())
    assert summary["row"] == "cls" and summary["scored"] == 2
    ds = cache.open_store(tiny_stores["dino"])
    per_object, best = [], []
    for name, (w, h, bs) in boxes.items():
        att = ds.attention_224.sel(image=name).values.astype(np.float64)
        masks = [plain_mask(att[hh, 0, 1:], 0.6) for hh in range(att.shape[0])]
        g = images.geometry(w, h, 224)
        xs, ys = g.source_centres()
        objs = []
        for x0, y0, x1, y1 in bs:
            rle = mask_utils.frPyObjects([[x0, y0, x1, y0, x1, y1, x0, y1]], h, w)
            full = mask_utils.decode(mask_utils.merge(rle)).astype(bool)
            # each view pixel takes the original pixel under its centre
            objs.append(np.array([[full[min(int(y), h - 1), min(int(x), w - 1)] for x in xs] for y in ys]))
        ious = [[plain_iou(m, 14, 16, o) for m in masks] for o in objs]
        union = np.any(objs, axis=0)
        per_object.append(np.mean([max(row) for row in ious]))
        best.append(max(plain_iou(m, 14, 16, union) for m in masks))
    assert summary["per_object"] == pytest.approx(np.mean(per_object), abs=1e-9)
    assert summary["best_head"] == pytest.approx(np.mean(best), abs=1e-9)
    saved = records.load(tiny_stores["dino"], "attention_masks")
    assert saved["mask"].shape == (ds.sizes["image"], 2, 196)
    assert [e.fields["purpose"] for e in ledger.entries(c)][-1] == "attention-masks: score"


def test_selfpatch_uses_its_aggregation_head_and_refuses_cls(tiny_stores, capsys, tmp_path):
    out = tmp_path / "s.json"
    code, printed = probe_main(["attention-masks", str(tiny_stores["selfpatch"]), "--json", str(out), "--workers", "1", "-q"], capsys)
    err = printed.err
    assert code == 0, err
    assert json.loads(out.read_text())["row"] == "aggregation"
    code, printed = probe_main(["attention-masks", str(tiny_stores["selfpatch"]), "--row", "cls", "-q"], capsys)
    err = printed.err
    assert code == 2 and "no class token" in err and len(err.strip().splitlines()) == 1
    code, printed = probe_main(["attention-masks", str(tiny_stores["selfpatch"]), "--mass", "1.5", "-q"], capsys)
    err = printed.err
    assert code == 2 and "--mass" in err

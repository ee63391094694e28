"""DINOv2's linear protocol (``analyses/linear_dinov2.py``) against facebookresearch/dinov2
``dinov2/eval/linear.py`` written out here: its ``create_linear_input``, ``LinearClassifier`` in a
``ModuleDict`` keyed by its names, SGD with momentum and cosine annealing over the summed losses,
batches from ``ShardedInfiniteSampler`` (``dinov2/data/samplers.py``) on one process, top-1 on val
and its choice of the best classifier; every weight, accuracy and choice must agree."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from probe_toolkit.analyses import linear_dinov2 as ld

# ----------------------------------------------------------------------------------------------
# the reference, written out


def ref_create_linear_input(x_tokens_list, use_n_blocks, use_avgpool):
    intermediate_output = x_tokens_list[-use_n_blocks:]
    output = torch.cat([class_token for _, class_token in intermediate_output], dim=-1)
    if use_avgpool:
        output = torch.cat((output, torch.mean(intermediate_output[-1][0], dim=1)), dim=-1)
        output = output.reshape(output.shape[0], -1)
    return output.float()


class RefLinearClassifier(nn.Module):
    def __init__(self, out_dim, use_n_blocks, use_avgpool, num_classes):
        super().__init__()
        self.use_n_blocks, self.use_avgpool = use_n_blocks, use_avgpool
        self.linear = nn.Linear(out_dim, num_classes)
        self.linear.weight.data.normal_(mean=0.0, std=0.01)
        self.linear.bias.data.zero_()

    def forward(self, x_tokens_list):
        return self.linear(ref_create_linear_input(x_tokens_list, self.use_n_blocks, self.use_avgpool))


def ref_sampler(sample_count, seed):
    """ShardedInfiniteSampler(shuffle=True, seed, start=0, step=1) with _shuffle_tensor_slice."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    perm = torch.randperm(sample_count, dtype=torch.int32, generator=generator)
    iter_count = 0
    while True:
        generator.manual_seed(seed + 0 + (iter_count << 24))
        result = np.empty(sample_count, dtype=np.int32)
        for i in range(sample_count):
            j = torch.randint(0, i + 1, size=(1,), generator=generator).item() if i > 0 else 0
            result[i] = result[j]
            result[j] = perm[0 + i * 1].item()
        yield from result
        iter_count += 1


def ref_run(tokens, labels, val_tokens, val_labels, rates, batch_size, epochs, epoch_length, n_classes, init_seed, seed=0, built=None, losses=None):
    """run_eval_linear on a one-process run, from per-image (patch tokens, class token) lists of the
    last 4 blocks (what ModelWithIntermediateLayers returns); (classifiers, their val top-1, best name).
    ``built`` and ``losses``, lists given, receive every classifier built (a replaced one too) and the loss every iteration."""
    torch.manual_seed(init_seed)  # the global generator, as the reference's classifiers draw from it
    sample_output = [(p[:1], c[:1]) for p, c in tokens]
    classifiers = nn.ModuleDict()
    groups = []
    for n in [1, 4]:
        for avgpool in [False, True]:
            for _lr in rates:
                lr = _lr * (batch_size * 1) / 256.0
                out_dim = ref_create_linear_input(sample_output, use_n_blocks=n, use_avgpool=avgpool).shape[1]
                classifier = RefLinearClassifier(out_dim, n, avgpool, n_classes)
                classifiers[f"classifier_{n}_blocks_avgpool_{avgpool}_lr_{lr:.5f}".replace(".", "_")] = classifier
                groups.append({"params": classifier.parameters(), "lr": lr})
                if built is not None:
                    built.append(classifier)
    optimizer = torch.optim.SGD(groups, momentum=0.9, weight_decay=0)
    max_iter = epochs * epoch_length
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max_iter, eta_min=0)
    order = ref_sampler(len(labels), seed)
    labels = torch.as_tensor(labels)
    for _ in range(max_iter):
        batch = torch.as_tensor(list(itertools.islice(order, batch_size)), dtype=torch.int64)
        features = [(p[batch], c[batch]) for p, c in tokens]
        outputs = {k: v(features) for k, v in classifiers.items()}
        loss = sum(nn.CrossEntropyLoss()(v, labels[batch]) for v in outputs.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if losses is not None:
            losses.append(float(loss.item()))
    top1 = {}
    with torch.no_grad():
        for k, v in classifiers.items():
            top1[k] = float((v(val_tokens).argmax(1) == torch.as_tensor(val_labels)).float().mean())
    max_accuracy, best = 0, ""
    for k, accuracy in top1.items():
        if accuracy > max_accuracy:
            max_accuracy, best = accuracy, k
    return classifiers, top1, best


def _data(seed, n, d=6, patches=5, classes=3):
    """Per block (patch tokens (n, patches, d), class token (n, d)) for the last 4 blocks, and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, d)) * 2
    blocks = []
    for b in range(4):
        cls = centres[labels] * (b + 1) / 4 + rng.normal(size=(n, d))
        blocks.append((torch.from_numpy(rng.normal(size=(n, patches, d)) + cls[:, None] * 0.3).float(), torch.from_numpy(cls).float()))
    return blocks, labels


# ----------------------------------------------------------------------------------------------


def test_the_sampler_is_dinov2s_sharded_infinite_sampler():
    for count, seed in ((1, 0), (7, 0), (50, 3)):
        assert list(itertools.islice(ld.sampler(count, seed), 3 * count + 5)) == [int(i) for i in itertools.islice(ref_sampler(count, seed), 3 * count + 5)]


def test_names_and_the_classifiers_the_reference_evaluates():
    """At batch 128 on one process the two smallest rates scale to 5e-6 and 1e-5, which print alike
    (lr_0_00001): the reference's ModuleDict keeps the second classifier in the first's place."""
    classifiers = ld.grid()
    assert len(classifiers) == 2 * 2 * 13 and classifiers[0].name == "classifier_1_blocks_avgpool_False_lr_0_00001"
    assert classifiers[1].name == classifiers[0].name and classifiers[2].name == "classifier_1_blocks_avgpool_False_lr_0_00003"
    reference = nn.ModuleDict()
    for i, c in enumerate(classifiers):
        reference[c.name] = nn.Linear(1, 1)
        reference[c.name].index = i
    assert ld.evaluated(classifiers) == [m.index for m in reference.values()]
    assert len(ld.evaluated(classifiers)) == 48  # one lost in each (blocks, avgpool) group
    assert len(ld.evaluated(ld.grid(batch_size=1024))) == 52  # eight GPUs' global batch: every name differs


def test_linear_input_is_create_linear_input():
    blocks, _ = _data(0, 9)
    cls_blocks = torch.stack([c for _, c in blocks], dim=1)
    mean = ld.patch_mean(blocks[-1][0])
    for n in (1, 2, 4):
        for avgpool in (False, True):
            assert torch.equal(ld.linear_input(cls_blocks, mean, n, avgpool), ref_create_linear_input(blocks, n, avgpool))


@pytest.mark.parametrize("batch_size, rates", [(8, (1e-3, 0.1, 0.5)), (4, (2e-5, 1e-5, 0.2))])
def test_training_evaluation_and_choice_are_the_references(batch_size, rates):
    blocks, labels = _data(1, 40)
    val_blocks, val_labels = _data(2, 25)
    val_blocks = [(p, c) for p, c in val_blocks]
    epochs, epoch_length = 2, 6
    reference, top1, best = ref_run(blocks, labels, val_blocks, val_labels, rates, batch_size, epochs, epoch_length, 3, init_seed=7)

    cls_blocks, mean = torch.stack([c for _, c in blocks], dim=1), ld.patch_mean(blocks[-1][0])
    classifiers = ld.grid(rates=rates, batch_size=batch_size)
    training = ld.train(cls_blocks, mean, labels, classifiers, 3, epochs=epochs, epoch_length=epoch_length, batch_size=batch_size, init_seed=7)
    assert len(training.losses) == epochs * epoch_length
    for c, layer in zip(classifiers, training.weights):
        if ld.evaluated(classifiers).count(classifiers.index(c)):
            ref = reference[c.name].linear
            assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias), c.name
    val_cls, val_mean = torch.stack([c for _, c in val_blocks], dim=1), ld.patch_mean(val_blocks[-1][0])
    scores = ld.accuracies(training, val_cls.numpy(), val_mean.numpy(), val_labels)
    for i in ld.evaluated(classifiers):
        assert scores[i, 0] == pytest.approx(top1[classifiers[i].name], abs=1e-7)
    chosen = ld.best_on_val(classifiers, scores[:, 0])
    assert (classifiers[chosen].name if chosen is not None else "") == best
    assert (scores[:, 1] >= scores[:, 0]).all()


def test_a_replaced_classifier_is_not_trained_and_the_loss_is_the_references_at_batch_128():
    """The size benchmarks/linear_dinov2.py runs (the 13 rates at batch 128, where lr_0_00001 names two
    classifiers): the reference's forward runs its ModuleDict's 48 items, so the replaced classifiers keep
    their initial weights and the logged loss sums 48 losses; every weight and every loss is the reference's."""
    blocks, labels = _data(3, 300)
    built, losses = [], []
    ref_run(blocks, labels, blocks, labels, ld.LEARNING_RATES, 128, 1, 3, 3, init_seed=5, built=built, losses=losses)
    classifiers = ld.grid()
    training = ld.train(torch.stack([c for _, c in blocks], dim=1), ld.patch_mean(blocks[-1][0]), labels, classifiers, 3, epochs=1, epoch_length=3, init_seed=5)
    assert len(built) == len(training.weights) == 52 and len(ld.evaluated(classifiers)) == 48
    for c, layer, ref in zip(classifiers, training.weights, built):
        assert torch.equal(layer.weight, ref.linear.weight) and torch.equal(layer.bias, ref.linear.bias), c.name
    replaced = [i for i in range(52) if i not in ld.evaluated(classifiers)]
    assert replaced == [0, 13, 26, 39] and all(not training.weights[i].bias.any() for i in replaced)  # never stepped: bias still 0
    assert training.losses == losses


def test_no_classifier_above_zero_is_no_choice():
    classifiers = ld.grid(rates=(0.1,))
    assert ld.best_on_val(classifiers, np.zeros(len(classifiers))) is None
    top1 = np.array([0.2, 0.5, 0.5, 0.1])
    assert ld.best_on_val(classifiers, top1) == 1  # the first of the largest


# ----------------------------------------------------------------------------------------------
# the protocol, from class-folder panels to a record


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """train/, val/ and test/ class folders (three colours under noise) and a tiny DINO's and a tiny
    DINOv2-with-registers' eval224 stores over them, float32."""
    from test_knn import _image

    from probe_toolkit.demo.samples import TINY, TINY_DINOV2_REG, write_checkpoint
    from probe_toolkit.store.extract import Settings, extract

    root = tmp_path_factory.mktemp("dinov2-linear")
    colours = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
    for s, (split, n) in enumerate((("train", 6), ("val", 3), ("test", 3))):
        for c, (name, colour) in enumerate(colours.items()):
            for i in range(n):
                _image(root / "data" / split / name / f"{i}.png", colour, seed=1000 * s + 100 * c + i, sd=60.0)
    stores = {}
    for family, (layout, arch) in {"dino": ("dino-full", TINY), "dinov2": ("dinov2-reg-backbone", TINY_DINOV2_REG)}.items():
        checkpoint = write_checkpoint(root / f"{family}.pth", layout, arch, seed=4)
        stores[family] = (
            checkpoint,
            extract(
                checkpoint, root / "data", settings=Settings(views=("eval224",), attention="none", chunk=8, dtype="float32"), store=root / f"{family}.zarr", quiet=True
            ).store,
        )
    return root, stores


def _panels(root, cache):
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    for name, split in (("tr", "train"), ("va", "val"), ("te", "test")):
        r = CliRunner().invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(cache)])
        assert r.exit_code == 0, r.output


def _store_features(store, checkpoint, split, registers):
    """(per block (patch, cls) list of the last block, labels) from the store's tokens and the checkpoint's final norm, written out."""
    from probe_toolkit.store import cache as store_cache
    from probe_toolkit.store.checkpoints import load_checkpoint

    ds = store_cache.open_store(store)
    ids = [i for i in ds.image.values.tolist() if i.startswith(f"{split}/")]
    ids = sorted(ids, key=lambda i: (["blue", "green", "red"].index(i.split("/")[1]), i))
    backbone = load_checkpoint(checkpoint).backbone
    ln = nn.LayerNorm(backbone["norm.weight"].shape[0], eps=1e-6).double()
    ln.weight.data, ln.bias.data = backbone["norm.weight"].double(), backbone["norm.bias"].double()
    with torch.no_grad():
        patches = ln(torch.from_numpy(ds["tokens_eval224"].sel(image=ids).values.astype(np.float64))).float()
        cls = ln(torch.from_numpy(ds["cls_tokens_eval224"].sel(image=ids).values.astype(np.float64))).float()
    labels = np.array([["blue", "green", "red"].index(i.split("/")[1]) for i in ids])
    return [(patches, cls)], labels


@pytest.mark.parametrize("family", ["dino", "dinov2"])
def test_the_protocol_end_to_end_is_the_references_loop(folders, family, tmp_path, capsys):
    from cli_runs import probe_main

    from probe_toolkit.labels import ledger
    from probe_toolkit.results import records

    root, stores = folders
    checkpoint, store = stores[family]
    cache = tmp_path / "cache"
    _panels(root, cache)
    rates = (1e-3, 0.05, 0.5)
    out = tmp_path / "l.json"
    code, printed = probe_main(
        [
            "linear-dinov2",
            store,
            "--train",
            "tr",
            "--val",
            "va",
            "--test",
            "te",
            "--unseal",
            "the test split of a test",
            "--n-last-blocks",
            "1",
            "--learning-rates",
            ",".join(map(str, rates)),
            "--epochs",
            "2",
            "--epoch-length",
            "5",
            "--batch-size",
            "8",
            "--init-seed",
            "3",
            "--cache",
            cache,
            "--json",
            out,
            "-q",
        ],
        capsys,
    )
    assert code == 0, printed.err
    assert "chosen on val" in printed.out and "(test)" in printed.out
    train, labels = _store_features(store, checkpoint, "train", family == "dinov2")
    val, val_labels = _store_features(store, checkpoint, "val", family == "dinov2")
    test, test_labels = _store_features(store, checkpoint, "test", family == "dinov2")

    def ref_block_run():  # the reference's loop on n_last_blocks (1,) only: its grid's n = 1 half
        torch.manual_seed(3)
        classifiers, groups = nn.ModuleDict(), []
        for avgpool in (False, True):
            for _lr in rates:
                lr = _lr * 8 / 256.0
                c = RefLinearClassifier(ref_create_linear_input([(p[:1], k[:1]) for p, k in train], 1, avgpool).shape[1], 1, avgpool, 3)
                classifiers[f"classifier_1_blocks_avgpool_{avgpool}_lr_{lr:.5f}".replace(".", "_")] = c
                groups.append({"params": c.parameters(), "lr": lr})
        optimizer = torch.optim.SGD(groups, momentum=0.9, weight_decay=0)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10, eta_min=0)
        order, y = ref_sampler(len(labels), 0), torch.as_tensor(labels)
        for _ in range(10):
            batch = torch.as_tensor(list(itertools.islice(order, 8)), dtype=torch.int64)
            loss = sum(nn.CrossEntropyLoss()(v([(p[batch], k[batch]) for p, k in train]), y[batch]) for v in classifiers.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        with torch.no_grad():
            top1 = {k: float((v(val).argmax(1) == torch.as_tensor(val_labels)).float().mean()) for k, v in classifiers.items()}
            best = max(top1, key=lambda k: (top1[k], -list(top1).index(k)))
            return top1, best, float((classifiers[best](test).argmax(1) == torch.as_tensor(test_labels)).float().mean())

    top1, best, on_test = ref_block_run()
    summary = json.loads(out.read_text())
    assert summary["chosen"] == best and summary["reported_on"] == "test" and summary["accuracy"] == pytest.approx(on_test, abs=1e-7)
    assert {c["name"]: c["top1_val"] for c in summary["classifiers"]} == pytest.approx(top1, abs=1e-7)
    saved = records.load(store, "linear-dinov2")
    assert saved.attrs["blocks"] == [1] and saved.sizes["iteration"] == 10 and saved.attrs["chosen"] == best
    entries = ledger.entries(cache)
    assert [e.fields["purpose"] for e in entries] == ["linear-dinov2: fit", "linear-dinov2: choose", "linear-dinov2: score"]


def test_four_blocks_from_a_store_of_the_last_block_are_refused_before_any_label_read(folders, tmp_path, capsys):
    from cli_runs import probe_main

    from probe_toolkit.labels import ledger

    root, stores = folders
    cache = tmp_path / "cache"
    _panels(root, cache)
    code, printed = probe_main(["linear-dinov2", stores["dino"][1], "--train", "tr", "--val", "va", "--cache", cache, "-q"], capsys)
    err = " ".join(printed.err.split())
    assert code == 2 and "--n-last-blocks 4 reads blocks" in err and "--n-last-blocks 1" in err and len(printed.err.strip().splitlines()) == 1, printed.err
    assert ledger.entries(cache) == []
    for argv, words in (
        (["--avgpool", "sometimes"], "avgpool 'sometimes' is not one of both, off, on"),
        (["--learning-rates", "0.1,0.1"], "--learning-rates must be a non-empty list of positive numbers, each once (got 0.1,0.1)"),
        (["--n-last-blocks", "0"], "--n-last-blocks must be a non-empty list of"),
    ):
        code, printed = probe_main(["linear-dinov2", stores["dino"][1], "--train", "tr", "--val", "va", "--cache", cache, "-q", *argv], capsys)
        assert code == 2 and words in " ".join(printed.err.split()), printed.err
    assert ledger.entries(cache) == []


def test_a_network_without_class_token_is_refused_first_with_the_knn_that_classifies_it(folders, tmp_path, capsys):
    """SelfPatch's backbone has no class token: refused in one line before any view is asked for
    (a store of the 224 view alone is not sent to extract eval224 first) and before any label read;
    the line's ``probe knn`` (DINO's k-NN on the mean patch token), pasted, runs."""
    import shlex

    from cli_runs import probe_main

    from probe_toolkit.demo.samples import TINY, write_checkpoint
    from probe_toolkit.labels import ledger
    from probe_toolkit.store.extract import Settings, extract

    root, _ = folders
    cache = tmp_path / "cache"
    _panels(root, cache)
    checkpoint = write_checkpoint(tmp_path / "selfpatch.pth", "selfpatch-backbone", TINY, seed=4)
    store = extract(checkpoint, root / "data", settings=Settings(views=(224,), attention="none", chunk=8), store=tmp_path / "sp.zarr", quiet=True).store
    code, printed = probe_main(["linear-dinov2", store, "--train", "tr", "--val", "va", "--cache", cache, "-q"], capsys)
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and "without a class token" in printed.err and "eval224" not in printed.err, printed.err
    assert ledger.entries(cache) == []
    code, printed = probe_main([*shlex.split(printed.err.split("`")[1])[1:], "-q"], capsys)
    assert code == 0 and "mean of the last block's patch tokens" in printed.out, printed.err

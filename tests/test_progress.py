"""Progress inside one item (``infra.progress.within``): the line counts the work's own steps to
its total and goes away; the numbers are the same with or without it. Nothing here measures time."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
from rich.console import Console
from test_catalogue import probe

from probe_toolkit.analyses.stats import bootstrap_mean
from probe_toolkit.demo.samples import TINY
from probe_toolkit.infra import progress


def test_bootstrap_reports_every_resample_and_its_numbers_do_not_change():
    n = 2000  # passes of 500,000 // n = 250 resamples: ten of them
    values = np.random.default_rng(3).normal(size=(n, 2))
    ticks: list[int] = []
    counted = bootstrap_mean(values, n_boot=2500, seed=1, progress=ticks.append)
    plain = bootstrap_mean(values, n_boot=2500, seed=1)
    assert ticks == [250] * 10
    assert all(np.array_equal(a, b) for a, b in zip(counted, plain))
    rng = np.random.default_rng(1)  # the same seeded resamples, pass by pass, written out here
    means = np.concatenate([values[rng.integers(0, n, size=(250, n))].mean(axis=1) for _ in range(10)])
    np.testing.assert_allclose(plain.low, np.quantile(means, 0.025, axis=0), rtol=1e-12)  # quantile of all columns at once vs one
    np.testing.assert_allclose(plain.high, np.quantile(means, 0.975, axis=0), rtol=1e-12)


def test_within_adds_a_line_under_the_running_bar_and_removes_it():
    out = io.StringIO()
    with progress.bar("images", console=Console(file=out, width=120)) as bar:
        outer = bar.add_task("store", total=3)
        with progress.within("bootstrap: 40 resamples", 40) as advance:
            assert len(bar.tasks) == 1  # nothing shown before the work starts
            for _ in range(4):
                advance(10)
            (inner,) = [t for t in bar.tasks if t.id != outer]
            assert inner.description == "  └ bootstrap: 40 resamples" and inner.completed == inner.total == 40
        assert [t.id for t in bar.tasks] == [outer]
    with progress.within("nothing runs", 5) as advance:  # no bar (the Python API): nothing to show
        advance(5)
    with progress.bar("images", quiet=True) as bar, progress.within("quiet", 5) as advance:
        advance(5)
        assert len(bar.tasks) == 0


def test_entropy_shows_its_bootstrap_line_and_gives_the_same_numbers(tiny_stores, tmp_path, monkeypatch):
    store = tmp_path / "s.zarr"
    shutil.copytree(tiny_stores["dino"], store)
    shown = []
    real = progress.Bar.remove_task

    def remove_task(self, task_id):
        task = self._tasks[task_id]
        shown.append((task.description, task.completed, task.total))
        return real(self, task_id)

    monkeypatch.setattr(progress.Bar, "remove_task", remove_task)
    loud = probe("entropy", store, "--boot", "20000", "--json", tmp_path / "loud.json")
    assert loud.code == 0, loud.err
    assert shown == [("  └ bootstrap: 20,000 resamples", 20000, 20000)]
    quiet = probe("entropy", store, "--boot", "20000", "--json", tmp_path / "quiet.json", "-q")
    assert quiet.code == 0 and len(shown) == 1  # --quiet: no line
    strip = lambda path: {k: v["summary"] for k, v in json.loads(path.read_text())["stores"].items()}  # noqa: E731
    assert strip(tmp_path / "loud.json") == strip(tmp_path / "quiet.json")


def test_a_very_large_image_shows_its_forward_pass_block_by_block_and_the_store_is_the_same(tiny_checkpoints, tmp_path, monkeypatch):
    """``extract --views native`` on one large image: each block of the forward pass is a step of a
    line under the images bar (the threshold lowered here so a small image counts as large); the
    stored tokens, keys and attention are the bits of the one-call forward."""
    import zarr
    from conftest import synthetic_scene

    from probe_toolkit.store import backbone

    folder = tmp_path / "big"
    folder.mkdir()
    synthetic_scene(folder / "big.png", (160, 128), [(20, 20, 90, 100)], seed=5)
    args = ["extract", tiny_checkpoints["dino-full"], "--images", folder, "--views", "native", "--chunk", "1", "--cache", tmp_path / "cache"]
    plain = probe(*args, "--store", tmp_path / "plain.zarr", "-q")
    assert plain.code == 0, plain.err
    shown = []
    real = progress.Bar.remove_task
    monkeypatch.setattr(
        progress.Bar,
        "remove_task",
        lambda self, task_id: (shown.append((self._tasks[task_id].description, self._tasks[task_id].completed, self._tasks[task_id].total)), real(self, task_id))[1],
    )
    monkeypatch.setattr(backbone, "LONG_FORWARD_TOKENS", 10)
    stepped = probe(*args, "--store", tmp_path / "stepped.zarr")
    assert stepped.code == 0, stepped.err
    ((description, completed, total),) = shown
    tokens = (160 // 16) * (128 // 16) + 1  # the patches and the class token of the tiny /16 network
    assert description == f"  └ forward pass: {tokens:,} tokens" and completed == total == TINY.depth  # one step per block
    a, b = (zarr.open_group(str(tmp_path / f"{n}.zarr"), mode="r") for n in ("plain", "stepped"))
    for name in ("tokens_native", "keys_native"):
        assert np.array_equal(np.asarray(a[name][:]), np.asarray(b[name][:]), equal_nan=True), name

"""The runner (infra/runner.py) behind ``probe attention-masks``, ``probe knn``, ``probe propagate``
and DSM's colour term: every saved array and JSON number is the same bits at one and two local
processes and on a real local dask cluster; bad placements, a cluster whose workers lack the
store and Ctrl-C are one line with the right status, and the rerun works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_runs import probe_main

from probe_toolkit.infra import chunked, runner
from probe_toolkit.store import cache


def _saved(store: Path, name: str) -> dict[str, np.ndarray]:
    ds = cache.load_results(store, name).load()
    return {k: ds[k].values for k in [*ds.data_vars, *ds.coords]}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


def _run(args: list, capsys) -> None:
    code, printed = probe_main(args, capsys)
    assert code == 0, printed.err


def _one_line(args: list, capsys, code: int, says: str) -> None:
    got, printed = probe_main(args, capsys)
    err = printed.err.strip()
    assert got == code and says in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as running:
        yield running.scheduler_address


# ----------------------------------------------------------------------------------------------
# probe attention-masks


@pytest.mark.parametrize("kind", ["dino", "selfpatch"])  # the class token's row (numpy); SelfPatch's ca_head (torch)
def test_attention_masks_same_bits_at_one_two_workers_and_on_a_cluster(tiny_stores, tmp_path, capsys, cluster, kind):
    store = tiny_stores[kind]
    got = {}
    for place in (["--workers", "1"], ["--workers", "2"], ["--dask-address", cluster]):
        out = tmp_path / f"{place[-1].replace('/', '_')}.json"
        _run(["attention-masks", str(store), "--json", str(out), "-q", *place], capsys)
        got[place[-1]] = (_saved(store, "attention_masks"), json.loads(out.read_text()))
    one = got["1"]
    assert one[0]["mask"].shape[0] == 7 and 0 < one[0]["mask"].mean() < 1  # two blocks of the store's chunk of 4
    for other in ("2", cluster):
        _same(one[0], got[other][0])
        assert one[1] == got[other][1]

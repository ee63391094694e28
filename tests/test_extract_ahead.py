"""store/ahead.py: each run's pass begins before the run before it is collected, runs still come
back in order, and a run whose decoding failed raises only when it is reached; store/streams.py:
two callers may give the streams work at once and each gets its own images' values."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from probe_toolkit.demo.samples import TINY
from probe_toolkit.store.ahead import Ahead
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.streams import Streams


class Log:
    def __init__(self, bad: int | None = None):
        self.events: list[tuple[str, int]] = []
        self.threads: dict[int, str] = {}
        self.bad = bad
        self.lock = threading.Lock()

    def take(self, i: int) -> str:
        with self.lock:
            self.events.append(("take", i))
        if i == self.bad:
            raise ValueError(f"run {i} cannot be decoded")
        return f"pixels {i}"

    def forward(self, i: int, taken: str) -> str:
        with self.lock:
            self.events.append(("forward", i))
            self.threads[i] = threading.current_thread().name
        return f"arrays of {taken}"


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_runs_come_back_in_order_with_their_passes_begun_ahead(depth):
    log = Log()
    with Ahead(5, log.take, log.forward, depth) as runs:
        got = []
        for i in range(5):
            got.append(runs.get(i))
            # by the time run i is collected, runs up to i + depth were taken (and no further)
            assert max(j for kind, j in log.events if kind == "take") == min(i + depth, 4)
    assert got == [(f"pixels {i}", f"arrays of pixels {i}") for i in range(5)]
    assert [j for kind, j in log.events if kind == "take"] == list(range(5))
    assert sorted(j for kind, j in log.events if kind == "forward") == list(range(5))
    main = threading.current_thread().name
    assert all((name == main) == (depth == 0) for name in log.threads.values())


def test_a_run_not_yet_decoded_is_not_waited_for_before_the_run_before_it_is_collected():
    """Run 2's pixels are not there when run 1 is collected: run 1 comes back without run 2 being
    taken (a loader held on run 2 must not keep run 1, already computed, from being written)."""
    log = Log()
    decoded = {0, 1, 3}
    with Ahead(4, log.take, log.forward, 1, ready=lambda i: i in decoded) as runs:
        assert runs.get(0)[0] == "pixels 0" and [j for kind, j in log.events if kind == "take"] == [0, 1]
        assert runs.get(1)[0] == "pixels 1" and [j for kind, j in log.events if kind == "take"] == [0, 1]
        assert runs.get(2)[0] == "pixels 2" and [j for kind, j in log.events if kind == "take"] == [0, 1, 2, 3]
        assert runs.get(3) == ("pixels 3", "arrays of pixels 3")


@pytest.mark.parametrize("depth", [0, 1])
def test_a_run_that_cannot_be_decoded_raises_when_it_is_reached(depth):
    log = Log(bad=2)
    collected = []
    with pytest.raises(ValueError, match="run 2"), Ahead(5, log.take, log.forward, depth) as runs:
        for i in range(5):
            collected.append(runs.get(i)[0])
    assert collected == ["pixels 0", "pixels 1"]  # the runs before it came back (and were written)
    taken = [j for kind, j in log.events if kind == "take"]
    assert taken == [0, 1, 2]  # none after it is decoded
    assert 2 not in log.threads and 3 not in log.threads


def test_leaving_early_waits_for_the_passes_begun():
    finished = []

    def forward(i: int, taken: int) -> int:
        time.sleep(0.05)
        finished.append(i)
        return i

    with Ahead(4, lambda i: i, forward, 1) as runs:
        assert runs.get(0) == (0, 0)
    assert finished == [0, 1]  # run 1's pass, begun ahead, ended before the exit returned
    assert not any(t.name.startswith("probe-forward") for t in threading.enumerate())


def test_two_callers_share_the_streams_and_each_gets_its_own_values():
    """Two threads run passes at once on three streams (batches of 7, 5, 4 and 2, and single images): every
    value is what one pass on torch's threads gives, and no copy of the network serves two passes."""
    torch.manual_seed(0)
    model = Backbone(TINY).eval()
    batches = [torch.randn(n, 3, 224, 224) for n in (7, 1, 5, 1, 4, 2)]
    with torch.inference_mode():
        expected = [model.vit.forward_features(b) for b in batches]
    busy: set[int] = set()
    clash = []
    lock = threading.Lock()

    def work(replica, images):
        with lock:
            clash.append(id(replica) in busy)
            busy.add(id(replica))
        try:
            with torch.inference_mode():
                return {"out": replica.vit.forward_features(images)}
        finally:
            with lock:
                busy.discard(id(replica))

    results: dict[int, torch.Tensor] = {}
    with Streams(model, 3) as streams:

        def caller(which: list[int]) -> None:
            for i in which:
                results[i] = streams.run(batches[i], work)["out"]

        threads = [threading.Thread(target=caller, args=(list(range(k, len(batches), 2)),)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not any(clash)
    for i, want in enumerate(expected):
        assert torch.allclose(results[i], want, atol=1e-5, rtol=1e-5), i


def test_a_single_image_runs_on_a_copy_made_from_no_pass():
    """A copy for a caller's single image is made from a network no pass runs on: a copy of
    stream 0's network taken while a pass had its hooks on it would keep them (and feed that
    pass's capture from then on)."""
    model = Backbone(TINY).eval()
    with Streams(model, 2) as streams:
        handle = streams.models[0].vit.blocks[0].register_forward_hook(lambda *args: None)  # a pass under way on stream 0
        used = []
        streams.run(torch.zeros(1, 3, 224, 224), lambda replica, images: used.append(replica) or {})
        handle.remove()
    (copy,) = used
    assert copy is not streams.models[0] and copy is not streams.models[1]
    assert not any(m._forward_hooks for m in copy.modules())
    assert all(a is b for a, b in zip(copy.parameters(), model.parameters()))


@pytest.mark.parametrize("depth", [1, 2])
def test_a_caller_going_on_past_a_failed_run_gets_each_later_run_in_turn(depth):
    """The runs after a failed one are not begun ahead; a caller that catches the failure and goes
    on gets each of them taken and passed when reached, with its own pixels."""
    log = Log(bad=1)
    got = {}
    with Ahead(5, log.take, log.forward, depth) as runs:
        for i in range(5):
            try:
                got[i] = runs.get(i)
            except ValueError:
                got[i] = "failed"
    assert got == {0: ("pixels 0", "arrays of pixels 0"), 1: "failed", **{i: (f"pixels {i}", f"arrays of pixels {i}") for i in (2, 3, 4)}}
    assert [j for kind, j in log.events if kind == "take"] == [0, 1, 2, 3, 4]

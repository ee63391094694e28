"""The report's figures read as a reader reads them (issue 47): the numbers in titles as precise as the tables, nothing
drawn past its axes or past T, every head's line visible, masks in colours that stand out, names and legends present."""

from __future__ import annotations

import matplotlib.colors
import numpy as np
from report_reader import absolute_paths, outside_axes

from probe_toolkit.report import figures_attention, figures_maps, sections_correspond, sections_dense
from probe_toolkit.report.sources import shown_path


def test_entropy_titles_keep_the_decimal_the_tables_print():
    rows = np.full((2, 196), 1 / 196)
    drawing = figures_attention.attention_rows(rows, np.zeros((2, 5), int), np.array([195.8, 195.74]), 14, 34, "t")
    titles = [ax.get_title() for ax in drawing.figure.axes]
    assert "head 0: $e^H$ 195.8" in titles and "head 1: $e^H$ 195.7" in titles and not any("196" in t for t in titles)


def test_no_histogram_bin_past_t_and_nothing_outside_the_axes():
    rng = np.random.default_rng(0)
    per_store = {"a": 195.0 + 0.8 * rng.random((20, 2)), "b": 194.4 + 1.5 * rng.random((20, 2))}
    drawing = figures_attention.effective_histograms(per_store, {"a": 196, "b": 196})
    fig = drawing.figure
    assert outside_axes(fig) == []
    for ax in fig.axes:
        if ax.get_visible():
            assert ax.get_xlim()[1] <= 196.0
            for patch in ax.patches:
                assert patch.get_path().vertices[:, 0].max() <= 196.0 + 1e-9


def test_equal_heads_stay_visible_and_the_legend_leaves_the_panels_their_width():
    values = np.tile(np.array([[150.0], [150.0]]).T, (4, 1))  # two heads with the same values in every block
    drawing = figures_attention.block_spread({"store": values}, {"store": [0, 1, 2, 3]}, keys=196)
    ax = drawing.figure.axes[0]
    head0, head1 = [line for line in ax.lines if line.get_label().startswith("head")]
    assert (head0.get_linestyle(), head0.get_marker()) != (head1.get_linestyle(), head1.get_marker())
    assert head0.get_linewidth() > head1.get_linewidth()
    legend = drawing.figure.legends[0]
    assert legend._ncols == 3  # head 0, head 1 and T, side by side below the panel, not a column beside it
    assert outside_axes(drawing.figure) == []


def test_a_mask_never_takes_its_objects_colour():
    orange = matplotlib.colors.to_rgb(figures_maps.MASK_PALETTE[0])
    picture = np.zeros((40, 40, 3), np.uint8)
    picture[10:30, 10:30] = (np.array(orange) * 255).astype(np.uint8)  # an orange object on black
    mask = np.zeros((40, 40), bool)
    mask[10:30, 10:30] = True
    chosen = figures_maps.contrasting(picture, [mask])[0]
    assert chosen != orange
    assert np.sum((np.array(chosen) - np.array(orange)) ** 2) == max(
        np.sum((np.array(matplotlib.colors.to_rgb(c)) - np.array(orange)) ** 2) for c in figures_maps.MASK_PALETTE
    )


def test_the_match_is_drawn_above_its_target_ring():
    side = 32
    picture = np.zeros((side, side, 3), np.uint8)
    xy = np.array([[10.0, 10.0]])
    drawing = sections_correspond.matches_drawing(picture, picture, xy, xy, np.array([[10.0 / side, 10.0 / side]]), np.array([0.01]), 0.1, "t")
    ax = drawing.figure.axes[0]
    ring = [c for c in ax.collections if len(c.get_facecolors()) == 0]
    crosses = [c for c in ax.collections if c is not ring[0] and c.get_zorder() > ring[0].get_zorder()]
    assert ring and len(crosses) == 2  # the × (edged) above the ring


def test_segmentation_figures_name_the_store_and_their_classes_and_count_whole_iterations():
    truth = np.zeros((16, 16), np.uint8)
    truth[4:12, 4:12] = 1
    picture = np.zeros((16, 16, 3), np.uint8)
    drawing = sections_dense.segmentation_maps([("a.jpg", picture, truth, truth)], np.linspace(2, 1, 10), "store A", ["background", "cat"])
    fig = drawing.figure
    assert fig._suptitle.get_text() == "store A"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["background", "cat"]
    loss = fig.axes[-1]
    assert all(float(t).is_integer() for t in loss.get_xticks())
    drawing = sections_dense.retrieval_maps([("a.jpg", picture, truth, [("1000", truth)])], "store A", ["background", "cat"])
    assert drawing.figure._suptitle.get_text() == "store A" and len(drawing.figure.legends) == 1


def test_shown_paths_are_never_the_machines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "cache" / "a.zarr") == "cache/a.zarr"
    assert shown_path("/elsewhere/data/run/cache/b.zarr") == "…/cache/b.zarr"
    assert absolute_paths(f"store {shown_path('/elsewhere/x/y.zarr')} and /tmp/z/w", [tmp_path]) == ["/tmp/z/w"]

"""A sweep's comparison.png: each bar labelled with its value, and the axis zoomed to close
values (0.915 against 0.94 of accuracy look different), saying on the axis that it does not
start at 0; values far apart keep an axis from 0."""

from __future__ import annotations

from framework.tracking.bars import value_bars, zoomed_range
from framework.tracking.sweep_summary import plot


def test_zoomed_range_only_when_bars_from_0_would_look_alike():
    left, right = zoomed_range([0.915, 0.94])
    assert 0.85 < left < 0.915 and 0.94 < right < 1.0  # the data fill most of the axis
    assert (0.94 - 0.915) / (right - left) > 0.5
    assert zoomed_range([0.2, 3.8]) is None  # far apart: bars from 0 show it
    assert zoomed_range([-1.0, -0.9]) is None  # negative values: no zoom (bars grow from 0)
    assert zoomed_range([None, float("nan")]) is None
    lo, hi = zoomed_range([0.5, 0.5])  # all equal: a window around the value
    assert lo < 0.5 < hi


def _axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    return plt, fig, ax


def test_bars_show_their_values_and_a_zoomed_axis_says_so():
    plt, fig, ax = _axes()
    value_bars(ax, [0.915, 0.94, None], ["lr=0.01", "lr=0.05", "lr=0.1"], "val/acc")
    texts = [t.get_text() for t in ax.texts]  # bar_label's annotations are texts of the axes
    assert {"0.915", "0.94", "no value"} <= set(texts)
    left, right = ax.get_xlim()
    assert left > 0.85 and right < 1.05
    assert "not 0" in ax.get_xlabel() and f"{left:.4g}" in ax.get_xlabel()
    assert "//" in texts  # the break mark where the axis would have met 0
    plt.close(fig)

    plt, fig, ax = _axes()
    value_bars(ax, [0.2, 3.8], ["a", "b"], "time/epoch_virtual_s")
    assert ax.get_xlim()[0] <= 0 and ax.get_xlabel() == "time/epoch_virtual_s"
    assert {"0.2", "3.8"} <= {t.get_text() for t in ax.texts}
    plt.close(fig)


def test_comparison_png_is_drawn(tmp_path):
    rows = [{"run": n, "train.lr": lr, "val/acc": acc, "time/epoch_virtual_s": t} for n, lr, acc, t in (("a", "0.01", 0.915, 3.84), ("b", "0.05", 0.94, 1.2))]
    path = plot({"rows": rows, "columns": ["train.lr"]}, "val/acc", tmp_path)
    assert path == tmp_path / "comparison.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

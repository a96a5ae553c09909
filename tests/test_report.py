import numpy as np
from PIL import Image

from lace.report.document import Report, Table, format_cell
from lace.report.plots import atom_bars, grouped_bars, image_grid, nk_histograms


def test_report_writes_markdown_and_self_contained_html(tmp_path):
    chart = grouped_bars({"swap": {"plain": 0.6, "lace": 0.8}}, tmp_path / "bars.png", "binding")
    report = Report("Demo")
    report.heading("Results")
    report.table(Table(["model", "R@1"], [["plain", 0.51234], ["lace", None]], caption="retrieval"))
    report.figure(chart, "ablation")
    markdown_path, html_path = report.write(tmp_path)
    markdown = markdown_path.read_text()
    assert "| plain | 0.512 |" in markdown and "| lace | — |" in markdown
    assert "![ablation](bars.png)" in markdown
    page = html_path.read_text()
    assert "data:image/png;base64," in page and "<td>0.512</td>" in page


def test_plots_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    paths = [
        nk_histograms({"a": rng.poisson(10, 100), "b": rng.poisson(10, 100)}, tmp_path / "nk.png", "N_k", 10),
        image_grid([("row", [Image.new("RGB", (8, 8), "red")] * 3, ["x", "y", "z"])], tmp_path / "grid.png"),
        atom_bars([("before", np.array([0.5, 0, 0.2])), ("after", np.array([0, 0.5, 0.2]))], ["red", "blue", "sq"],
                  tmp_path / "atoms.png"),
    ]
    for path in paths:
        assert Image.open(path).size[0] > 100


def test_format_cell():
    assert format_cell(float("nan")) == "n/a"
    assert format_cell(3) == "3"
    assert format_cell(0.12345, 2) == "0.12"


def _drawn(monkeypatch):
    """Keep each figure a plot function would save, drawn, instead of closing it."""
    from lace.report import plots

    figures = []

    def keep(figure, path):
        figure.canvas.draw()
        figures.append(figure)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def test_chance_lines_cross_only_the_groups_where_chance_is_defined(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    values = {metric: {"plain": 0.6, "lace": 0.7} for metric in ("i2t swap-att", "wino group", "R@1 i2t")}
    grouped_bars(values, tmp_path / "bars.png", "ablation", chance={"i2t swap-att": 0.5, "wino group": 1 / 6})
    axis = figures[0].axes[0]
    lines = [segment for collection in axis.collections for segment in collection.get_segments()]
    assert len(lines) == 2  # none across the R@1 group, whose chance the bars do not define
    spans = sorted((float(line[0][0]), float(line[1][0]), float(line[0][1])) for line in lines)
    assert spans[0][2] == 0.5 and spans[0][1] < 0.5  # the first group only (centred on 0)
    assert spans[1][2] == 1 / 6 and 0.5 < spans[1][0] and spans[1][1] < 1.5  # the second group only
    assert [text.get_text() for text in axis.get_legend().get_texts()].count("chance") == 1


def test_log_axes_label_plain_numbers(monkeypatch, tmp_path):
    figures = _drawn(monkeypatch)
    rng = np.random.default_rng(0)
    for counts in ({"a": rng.poisson(3, 40)}, {"a": rng.poisson(10, 2000), "b": rng.poisson(30, 2000)}):
        nk_histograms(counts, tmp_path / "nk.png", "N_k", 10)
    for figure in figures:
        axis = figure.axes[0].yaxis
        labels = [tick.get_text() for tick in axis.get_ticklabels() + axis.get_ticklabels(minor=True)]
        shown = [label for label in labels if label]
        assert shown and all(float(label) > 0 for label in shown), shown  # "1", "2", "5", ...: no "6×10⁰"


def test_edit_grid_rows_are_named_by_image_and_caption(monkeypatch, tmp_path):
    from lace.report import edit_grid

    drawn = []
    monkeypatch.setattr(edit_grid, "image_grid", lambda rows, path, title="": drawn.append(rows) or path)
    rows = [{"source": 3, "image": "scene_0003.png", "caption": "a red circle left of a blue square",
             "label": "before", "neighbours": [1, 2], "strength": None, "target_count": 1},
            {"source": 5, "label": "before", "neighbours": [1, 2], "strength": None, "target_count": 0}]
    edit_grid.write_edit_grid(rows, lambda i: Image.new("RGB", (4, 4)), tmp_path / "grid.png", "star", 2)
    first, second = (label for label, _, _ in drawn[0])
    assert first.startswith("scene_0003.png\n") and "a red circle left of a blue square" in first.replace("\n", " ")
    assert first.endswith("before: 1/2 star")
    assert second == "image 5\nbefore: 0/2 star"  # a row without a name or caption keeps its gallery row

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

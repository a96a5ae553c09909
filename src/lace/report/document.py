"""A report built from blocks, written as `report.md` and a self-contained `report.html`.

Blocks are headings, paragraphs, tables and figures. Tables take numbers straight from
results dictionaries, so every figure in a report is traceable to a results file; the
HTML embeds figures as base64 PNGs so it can be mailed or archived as one file.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lace.io import atomic_write_text

Cell = str | int | float | None


def format_cell(value: Cell, digits: int = 3) -> str:
    """Numbers to fixed digits, None to an em dash, NaN to 'n/a'."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.{digits}f}"
    return str(value)


def mean_std(entry: dict | None, show_n: bool = False) -> str:
    """A summary entry over seeds ({"mean", "std", "n"}, `lace.experiment.summary`) as "mean ± std", a single run as
    its value, with " (n)" when `show_n`; an em dash when no run has it."""
    if not entry or entry.get("mean") is None:
        return format_cell(None)
    n = entry.get("n", 1)
    text = f"{entry['mean']:.3f} ± {entry['std']:.3f}" if n > 1 else f"{entry['mean']:.3f}"
    return f"{text} ({n})" if show_n else text


@dataclass
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    caption: str = ""
    digits: int = 3

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(format_cell(c, self.digits) for c in row) + " |" for row in self.rows]
        text = "\n".join(lines)
        return f"{text}\n\n*{self.caption}*" if self.caption else text

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(format_cell(c, self.digits))}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class Figure:
    path: Path
    caption: str


@dataclass
class Report:
    """Accumulates blocks; `write(folder)` renders both documents next to the figures."""

    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def bullets(self, items: Sequence[str]) -> None:
        self.blocks.append(("bullets", list(items)))

    def table(self, table: Table) -> None:
        self.blocks.append(("table", table))

    def figure(self, path: str | Path, caption: str) -> None:
        self.blocks.append(("figure", Figure(Path(path), caption)))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def markdown(self, folder: Path) -> str:
        parts = [f"# {self.title}"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                parts.append("#" * level + " " + text)
            elif kind == "paragraph":
                parts.append(value)
            elif kind == "bullets":
                parts.append("\n".join(f"- {item}" for item in value))
            elif kind == "table":
                parts.append(value.markdown())
            elif kind == "figure":
                relative = Path(value.path).resolve().relative_to(folder.resolve()) if Path(value.path).is_absolute() else value.path
                parts.append(f"![{value.caption}]({relative})\n\n*{value.caption}*")
            elif kind == "code":
                parts.append(f"```\n{value}\n```")
        return "\n\n".join(parts) + "\n"

    def html(self, folder: Path) -> str:
        parts = [f"<h1>{html.escape(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
            elif kind == "paragraph":
                parts.append(f"<p>{html.escape(value)}</p>")
            elif kind == "bullets":
                parts.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in value) + "</ul>")
            elif kind == "table":
                parts.append(value.html())
            elif kind == "figure":
                path = value.path if Path(value.path).is_absolute() else folder / value.path
                data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
                parts.append(
                    f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(value.caption)}">'
                    f"<figcaption>{html.escape(value.caption)}</figcaption></figure>"
                )
            elif kind == "code":
                parts.append(f"<pre>{html.escape(value)}</pre>")
        style = (
            "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
            "td:first-child,th:first-child{text-align:left}caption{caption-side:bottom;font-style:italic;padding:4px}"
            "img{max-width:100%}figcaption{font-style:italic;color:#555}pre{background:#f6f6f6;padding:8px;overflow:auto}"
        )
        return (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
        )

    def write(self, folder: str | Path, stem: str = "report") -> tuple[Path, Path]:
        """Write `<stem>.md` and `<stem>.html` into `folder` (atomically); return both paths."""
        folder = Path(folder)
        markdown_path, html_path = folder / f"{stem}.md", folder / f"{stem}.html"
        atomic_write_text(markdown_path, self.markdown(folder))
        atomic_write_text(html_path, self.html(folder))
        return markdown_path, html_path

"""Every figure of a rendered report has alternative text taken from the markdown above it, and
nbconvert's "Alternative text is missing" warning is gone (ragbench/workspace/alt_text.py)."""

from __future__ import annotations

import base64
import io
import logging
import re

import matplotlib
import nbformat

from ragbench.workspace.alt_text import MAX_CHARS, describe_figures
from ragbench.workspace.render import render_notebook

matplotlib.use("Agg")


def png() -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def figure_cell(n: int, alt: str | None = None):
    meta = {"image/png": {"alt": alt}} if alt else {}
    out = nbformat.v4.new_output("display_data", data={"image/png": png()}, metadata=meta)
    return nbformat.v4.new_code_cell("plot()", execution_count=n, outputs=[out])


def notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        figure_cell(1),  # before any markdown
        nbformat.v4.new_markdown_cell(
            "## Accuracy & cost <per query>\n\nEach point is a *strategy*; the [Pareto]"
            "(https://x) front is drawn. More text."
        ),
        figure_cell(2),
        figure_cell(3, alt="My own description"),
        nbformat.v4.new_markdown_cell("## Where the misses come from"),
        figure_cell(4),
        nbformat.v4.new_markdown_cell("## Long\n\n" + "word " * 200),
        figure_cell(5),
    ]
    return nb


def alts(nb) -> list[str]:
    return [
        o.metadata["image/png"]["alt"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
    ]


def test_alt_text_is_the_heading_and_first_sentence_above_the_figure():
    nb = notebook()
    assert describe_figures(nb) == 4  # one figure already had its own
    first, second, own, misses, long = alts(nb)
    assert first == "Figure 1 of this report"
    assert second == (
        "Figure 2: Accuracy & cost <per query> - Each point is a strategy; the Pareto front is drawn."
    )
    assert own == "My own description" and misses == "Figure 4: Where the misses come from"
    assert len(long) == MAX_CHARS and long.endswith("...")


def test_rendered_report_images_carry_it_and_nbconvert_no_longer_warns(tmp_path, caplog):
    path = tmp_path / "report.ipynb"
    nbformat.write(notebook(), path)
    with caplog.at_level(logging.WARNING):
        html = render_notebook(path, tmp_path / "report.html").read_text()
    assert "Alternative text is missing" not in caplog.text
    imgs = re.findall(r"<img [^>]*>", html)
    assert len(imgs) == 5 and all(" alt=" in img for img in imgs)
    assert "No description has been provided" not in html
    # escaped: the heading's "&" and "<per query>" are text, not markup
    assert 'alt="Figure 2: Accuracy &amp; cost &lt;per query&gt; - Each point' in html
    assert 'alt="My own description"' in html


def test_the_shipped_notebooks_figures_are_described_by_their_own_section():
    """Each plotting cell of a shipped notebook, given a figure, is described by the section it
    sits in: none by the verdict's section above it (the verdict has no figure)."""
    from pathlib import Path

    wrong = []
    for path in sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code" and "report.plot_" in cell.source:
                cell.outputs = figure_cell(0).outputs
        describe_figures(nb)
        wrong += [(path.name, alt) for alt in alts(nb) if "Verdict" in alt]
    assert wrong == []

"""The report as one self-contained HTML page: its tables, its figures inlined, and links to the runs."""

from __future__ import annotations

import base64
import html

from pipeline.analysis.markdown import (
    ReportData,
    detail_lines,
    headline,
    look_rows,
    method_statement,
    run_names,
)

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.helps{background:#d9f2d9}.hurts{background:#f8d7d7}.inconclusive{background:#f4f4f4}.withheld{background:#fff1cc}
.headline{font-size:18px;padding:10px;background:#eef4ff;border-left:4px solid #3b6fd8}img{max-width:100%}
code,pre{background:#f6f6f6}"""


def _table(header: list[str], rows: list[list[str]], links: list[str] | None = None) -> str:
    """``links``: a last cell per row, already HTML (the row's runs)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{html.escape(c.split(" ")[0].strip(":"))}">{html.escape(c)}</td>'
            if i == len(row) - 1
            else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + (f"<td>{links[n]}</td>" if links else "")
        + "</tr>"
        for n, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _run_links(run_ids: str, names: dict[str, str], run_url: str) -> str:
    return " ".join(
        f'<a href="{html.escape(run_url.format(run=r))}">{html.escape(names.get(r, r[:8]))}</a>'
        for r in run_ids.split()
        if r
    )


def page(data: ReportData, figures: dict[str, bytes], interactive: str = "") -> str:
    """``interactive``: the Plotly figures' HTML (pipeline.analysis.iplots), before the PNGs of the rest."""
    lead = f'<p class="headline">{html.escape(data.lead)}</p>' if data.lead else ""
    looks = look_rows(data)
    names = run_names(data.frame)
    parts = [
        f"<h1>{html.escape(data.title)}</h1>{lead}",
        f'<p class="headline">{html.escape(headline(data))}</p>',
        f"<p>{html.escape(method_statement(data))}</p>",
        "<ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in data.conditions) + "</ul>",
        "<h2>What to look for</h2>",
        _table(
            ["configuration", "metric", "baseline", "speculation", "ratio", "verdict"]
            + (["MLflow runs"] if data.run_url else []),
            [cells for cells, _ in looks],
            [_run_links(runs, names, data.run_url) for _, runs in looks] if data.run_url else None,
        ),
        *(
            ["<h2>Can you trust this run?</h2><ul>"]
            + [f"<li>{html.escape(line.removeprefix('- ').replace('**', ''))}</li>" for line in data.trust]
            + ["</ul>"]
            if data.trust
            else []
        ),
        *([f"<pre>{html.escape(chr(10).join(data.sections))}</pre>"] if data.sections else []),
        "<h2>Where speculation stops paying</h2><ul>",
    ]
    parts += [f"<li>{html.escape(f'{c.engine} {c.method} k={c.k}: {c.text}')}</li>" for c in data.crossings]
    parts.append("</ul>")
    parts.append(interactive)
    for name, png in figures.items():
        parts.append(
            f'<h3>{html.escape(name)}</h3><img alt="{html.escape(name)}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        )
    # The rest (model, advice, k schedule, losslessness, gaps) as the Markdown summary has it.
    rest = "\n".join(detail_lines(data)) + "\n"
    parts.append(f"<h2>Model, advice, k schedule, losslessness</h2><pre>{html.escape(rest)}</pre>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(data.title)}</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>"
    )

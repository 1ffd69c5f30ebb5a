"""Reports of a store or of the published record: the rows every output is built from (`rows.py`), the
Markdown table (`markdown.py`), the HTML page (`site.py`), the SVG plots (`plots.py`), regressions and the
published record's format (`regressions.py`), the recommendation per GPU kind (`recommend.py`), and
publishing into `docs/`, staged and moved into place whole (`publish.py`), and the note a bisection leaves
in rows' evidence (`bisectnote.py`). Running cells and bisecting are `run/`'s and `bisection/`'s, above it."""

"""Where a tuple goes: the data path (index.md, architecture.md), the spool and its ledger (ingest.md,
reliability.md). Every name and file drawn here is one the pages and the code use."""

from __future__ import annotations

from drawing import INGEST, LOSS, MUTED, NEUTRAL, SPARK, SPOOL, SYNC, arrow, band, box, canvas, note, stamp
from matplotlib.axes import Axes
from matplotlib.figure import Figure

W = 18.5  # a box's width in the data path: four columns
COLS = (1.5, 24.33, 47.17, 70.0)

# (column, y, height, title, body, tone) of every box of the data path, row by row
DATA_PATH_BOXES = (
    (
        0,
        48,
        12,
        "generate",
        "N sender processes,\nbuckets built ahead;\na full queue is a\ncounted drop",
        INGEST,
    ),
    (1, 48, 12, "factory front end", "ZeroMQ ROUTER:\nhellos, frame cap;\nrecords what it\naccepted", INGEST),
    (2, 48, 12, "workers", "parse (numba) to\nArrow columns;\nbad rows go to\ndead letters", INGEST),
    (
        3,
        23.5,
        36.5,
        "spool",
        "per worker:\nArrow IPC segments,\npublished by\nrename\n\nthe ledger:\nbuckets.bin,\n"
        "rejected.bin,\neos.ndjson\n\na commit deletes\nwhat it committed",
        SPOOL,
    ),
    (2, 34.5, 8.5, "reader: driver", "offsets, partitions\nfrom the manifests", SPARK),
    (2, 23.5, 8.5, "reader: executors", "segments to\nArrow batches", SPARK),
    (1, 23.5, 13, "your query", 'any transformation;\nstamp(df, "x") adds\na stamp point\nanywhere', SPARK),
    (0, 23.5, 13, "sink", "handler; Parquet\nrecords; the driver\ncommits one\nmanifest per batch", SPARK),
    (3, 2, 12.5, "sync agents", "one per TSC domain;\nUDP probes\ntimed in C", SYNC),
    (2, 2, 12.5, "coordinator", "phases at start,\nevery N s, at stop;\nevery probe into\nsync tables", SYNC),
    (1, 2, 12.5, "translate", "each stamp into the\nreference domain\nwith its span's\nrelation", SYNC),
    (0, 2, 12.5, "latencies", "in ns, each with an\nerror bound and a\nstatus; summary,\nplots", SYNC),
)

# where each stamp column is taken: (x, y, point)
DATA_PATH_STAMPS = (
    (COLS[0] + W - 2.5, 60.0, "gen"),
    (COLS[2] + W - 3.5, 60.0, "factory"),
    (COLS[2] + 3.5, 23.5, "source"),
    (COLS[1] + W - 2.0, 36.5, "x"),
    (COLS[0] + W - 2.5, 36.5, "sink"),
)


def data_path() -> Figure:
    """Generator to factory to spool, reader to query to sink, sync to translate, with the stamps."""
    fig, ax = canvas(6.8)
    band(ax, 46.5, 21, "ingest (cp_source)", INGEST)
    band(ax, 22.0, 24, "Spark: the reader, your query, the sink", SPARK)
    band(ax, 0.5, 21, "cross-node time (cp_sync)", SYNC, right=True)
    for col, y, h, title, body, tone in DATA_PATH_BOXES:
        box(ax, (COLS[col], y), (W, h), title, body, tone)
    for i in range(3):  # ingest, left to right into the spool
        arrow(ax, (COLS[i] + W, 54), (COLS[i + 1], 54))
    arrow(ax, (COLS[3], 38.75), (COLS[2] + W, 38.75))  # the driver plans from the manifests
    arrow(ax, (COLS[3], 27.75), (COLS[2] + W, 27.75))  # executors read the segments
    arrow(ax, (COLS[2] + W / 2, 34.5), (COLS[2] + W / 2, 32.0))  # partitions
    arrow(ax, (COLS[2], 27.75), (COLS[1] + W, 27.75))
    arrow(ax, (COLS[1], 30.0), (COLS[0] + W, 30.0))
    for i in (3, 2, 1):  # probes, tables, translated latencies
        arrow(ax, (COLS[i], 8.25), (COLS[i - 1] + W, 8.25))
    # the sink's records go down to translate: an elbow, labelled on its level part
    ax.plot([COLS[0] + W - 4, COLS[0] + W - 4, COLS[1] + 6], [23.5, 17.5, 17.5], color=MUTED, lw=1.4)
    arrow(ax, (COLS[1] + 6, 17.5), (COLS[1] + 6, 14.5))
    note(ax, (COLS[0] + W + COLS[1]) / 2 + 1, 17.9, "records", va="bottom")
    for x, y, point in DATA_PATH_STAMPS:
        stamp(ax, x, y, point)
    stamp(ax, 39.0, 65.0, "gen")
    note(ax, 41.5, 65.0, "a stamp point: one cp_tsc_<point> column", ha="left")
    return fig


def _leak(ax: Axes, x: float, start: tuple[float, float], title: str, body: str) -> None:
    """Where tuples leave the path: a red box below it, joined by a dashed arrow from `start`."""
    box(ax, (x, 17.5), (20.0, 12.5), title, body, LOSS)
    arrow(ax, start, (min(max(start[0], x + 2.0), x + 18.0), 30.0), color=LOSS[0], dashed=True)


SPOOL_FILES = (
    ("1", "seg-…12.arrow.tmp", "written"),
    ("2", "seg-…12.arrow", "renamed"),
    ("3", "buckets.bin", "+ its bucket records"),
    ("4", "manifest.ndjson", "+ one line: published"),
    ("", "rejected.bin", "rejected rows, buckets"),
    ("", "deadletter.bin", "raw rejected frames"),
    ("", "eos.ndjson", "senders' end totals"),
)


def _spool_files(ax: Axes, x: float, y: float, w: float, h: float) -> None:
    """A worker's directory in the spool, its files in the order a publication touches them."""
    box(ax, (x, y), (w, h), "", "", SPOOL)
    note(
        ax,
        x + 1.0,
        y + h - 1.0,
        "spool/w0/",
        ha="left",
        va="top",
        fontsize=11,
        weight="bold",
        family="monospace",
    )
    for i, (step, name, what) in enumerate(SPOOL_FILES):
        ry = y + h - 4.6 - i * 3.05
        if step:
            disc = {"boxstyle": "circle,pad=0.15", "fc": SPOOL[0], "ec": SPOOL[0]}
            note(ax, x + 1.6, ry, step, weight="bold", color="#ffffff", bbox=disc)
        note(ax, x + 3.0, ry + 0.55, name, ha="left", family="monospace")
        note(ax, x + 3.0, ry - 0.85, what, ha="left", color=MUTED)


# the balance: each term, where it is counted, its colour
LEDGER_TERMS = (
    ("emitted", "ids assigned\n(end totals)", NEUTRAL),
    ("published", "wN/buckets.bin\nrecords", SPOOL),
    ("rejected", "wN/rejected.bin:\nrows and buckets", SPOOL),
    ("dropped", "the generator's\nend totals", LOSS),
    ("lost", "seq gaps over\nall workers", LOSS),
)


def _balance(ax: Axes) -> None:
    """emitted = published + rejected + dropped + lost, each term over where it is counted."""
    note(ax, 45.0, 14.5, "per sender that ended its stream:", color=MUTED)
    for (term, where, tone), x in zip(LEDGER_TERMS, (8.5, 27.0, 45.0, 63.0, 81.0), strict=True):
        chip = {"boxstyle": "round,pad=0.35", "fc": tone[1], "ec": tone[0]}
        note(ax, x, 10.5, term, fontsize=12, weight="bold", color=tone[0], bbox=chip)
        note(ax, x, 7.3, where, va="top", linespacing=1.2)
    for x, sign in zip((17.75, 36.0, 54.0, 72.0), "=+++", strict=True):
        note(ax, x, 10.5, sign, fontsize=14, weight="bold")
    text = "Spool(path).stats() adds these up per sender (cp_source/spool/ledger.py, SpoolStats)"
    note(ax, 45.0, 1.2, text, va="bottom", color=MUTED)


def spool_ledger() -> Figure:
    """Segments published by rename, the ledger's bucket records, and where each term is counted."""
    fig, ax = canvas(5.6)
    box(
        ax,
        (1.5, 35),
        (17, 18),
        "generator",
        "per sender: ids\nsender << 39 | n,\nbuckets with a\ngapless seq",
        INGEST,
    )
    box(ax, (28.0, 35), (16, 18), "front end", "records what it\naccepted in\n_front/\nledger.json", INGEST)
    box(ax, (49.5, 35), (15, 18), "workers", "parse, stamp,\nbuffer; publish\nabout every\nflush_ms", INGEST)
    _spool_files(ax, 68.0, 30.0, 21.0, 25.0)
    arrow(ax, (18.5, 44), (28.0, 44), "ZeroMQ")
    arrow(ax, (44.0, 44), (49.5, 44))
    arrow(ax, (64.5, 44), (68.0, 44))
    _leak(ax, 1.5, (10.0, 35.0), "dropped", "the queue was full:\nnot sent, ids in the\nsender's end totals")
    before = "sent, never seen by\nthe front end (factory\ndown, link dropped)"
    _leak(ax, 23.5, (23.25, 43.6), "lost before_factory", before)
    _leak(
        ax,
        45.5,
        (57.0, 35.0),
        "lost in_factory",
        "accepted, neither\npublished nor rejected\n(a worker died)",
    )
    _balance(ax)
    return fig

#!/usr/bin/env python3
"""Plot the metrics.jsonl of one or several llmtrain runs on shared axes.

Usage: scripts/plot_metrics.py RUN_DIR [RUN_DIR ...] [--out metrics.png] [--x step|tokens]
                               [--panels loss,val_loss,...] [--points NAME,...]

Five panels share the x axis (optimizer step, or training tokens with --x tokens): training
loss, validation loss, learning rate, gradient norm and tokens/s, and below them the validation
accuracies of synthetic tasks (val_acc, val_scaled_acc) when a run has them; each run is one colour,
labelled with its directory name. Values written as null (non-finite) and keys a line lacks
are left out. --panels keeps only the named ones of the five (and of the accuracy panels);
--points adds one panel per named synthetic evaluation point (the `name` of an `eval_points` entry,
e.g. L256 or L2048_kv512): its `scaled_acc` where the task reports one (state tracking), else its
`acc`. Draws with matplotlib's Agg backend, so no display is needed. --summary prints, per run and
panel, the number of points and the last one (what was drawn).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_util import pyplot  # noqa: E402

plt = pyplot(__file__, "plot_metrics")

PANELS = [
    ("loss", "training loss", False),
    ("val_loss", "validation loss", False),
    ("lr", "learning rate", False),
    ("grad_norm", "gradient norm", True),
    ("tokens_per_s", "tokens/s", False),
]
# Drawn only when some run has them (synthetic tasks, docs/SYNTHETIC.md).
OPTIONAL_PANELS = [
    ("val_acc", "validation accuracy", False),
    ("val_scaled_acc", "scaled accuracy", False),
]


def read_metrics(run_dir):
    """The records of RUN_DIR/metrics.jsonl, in file order. A partial last line (a run being
    written) is ignored; any other unreadable line raises ValueError naming the file and line."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not found (is {run_dir} an llmtrain run directory?)")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: still being written
                continue
            raise ValueError(f"{path}:{number}: not a JSON object: {e}") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}:{number}: a metrics line needs a \"step\" key")
        records.append(record)
    return records


POINT_PREFIX = "point:"


def value(record, key):
    """record[key], or for key "point:NAME" the scaled_acc (else acc) of the eval_points entry named NAME."""
    if not key.startswith(POINT_PREFIX):
        return record.get(key)
    for point in record.get("eval_points") or []:
        if isinstance(point, dict) and point.get("name") == key[len(POINT_PREFIX):]:
            return point.get("scaled_acc", point.get("acc"))
    return None


def point_title(runs, name):
    """The y label of eval point NAME's panel: "scaled acc NAME" when some run reports a scaled_acc for it."""
    scaled = any(isinstance(p, dict) and p.get("name") == name and "scaled_acc" in p
                 for _, records in runs for r in records for p in r.get("eval_points") or [])
    return f"{'scaled acc' if scaled else 'accuracy'} {name}"


def series(records, key, x_key):
    """(xs, ys) of the records that have a finite number under `key` (see value())."""
    xs, ys = [], []
    for r in records:
        y = value(r, key)
        if isinstance(y, (int, float)) and math.isfinite(y) and x_key in r:
            xs.append(r[x_key])
            ys.append(y)
    return xs, ys


def plot_runs(run_dirs, out, x_key="step", summary=False, keep=None, points=()):
    """Draws the panels for `run_dirs` into the image file `out` (format from its suffix): the five, the
    accuracy panels that some run has, only those named in `keep` if given, then one per eval point in `points`."""
    runs = [(run_dir, read_metrics(run_dir)) for run_dir in run_dirs]
    panels = PANELS + [p for p in OPTIONAL_PANELS if any(series(r, p[0], x_key)[0] for _, r in runs)]
    if keep is not None:
        unknown = sorted(set(keep) - {p[0] for p in PANELS + OPTIONAL_PANELS})
        if unknown:
            names = ", ".join(p[0] for p in PANELS + OPTIONAL_PANELS)
            raise ValueError(f"--panels: unknown panel {unknown[0]!r} (allowed: {names})")
        panels = [p for p in panels if p[0] in keep]
    panels += [(POINT_PREFIX + name, point_title(runs, name), False) for name in points]
    if not panels:
        raise ValueError("nothing to draw: --panels kept no panel and --points named none")
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(9, 2.2 * len(panels)), squeeze=False)
    axes = axes[:, 0]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(9, 2.2 * len(panels)))
    for run_dir, records in runs:
        label = os.path.basename(os.path.normpath(run_dir))
        color = None
        for ax, (key, title, log_y) in zip(axes, panels):
            xs, ys = series(records, key, x_key)
            if summary:
                last = f"{xs[-1]} {ys[-1]!r}" if xs else "-"
                print(f"{label} {key} {len(xs)} {last}")
            if not xs:
                continue
            (line,) = ax.plot(xs, ys, label=label, color=color, marker="o" if key == "val_loss" else None,
                              markersize=3)
            color = line.get_color()  # one colour per run across the panels
            if log_y:
                ax.set_yscale("log")
    for ax, (key, title, _) in zip(axes, panels):
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("optimizer step" if x_key == "step" else "training tokens")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.jsonl")
    parser.add_argument("--out", default="metrics.png", help="image file to write (default metrics.png)")
    parser.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis")
    parser.add_argument("--summary", action="store_true", help="print points per run and panel")
    parser.add_argument("--panels", help="comma-separated panels to keep (loss, val_loss, lr, grad_norm, "
                        "tokens_per_s, val_acc, val_scaled_acc)")
    parser.add_argument("--points", default="", help="comma-separated eval point names, one panel each")
    args = parser.parse_args(argv)
    keep = None if args.panels is None else [k for k in args.panels.split(",") if k]
    points = [n for n in args.points.split(",") if n]
    try:
        plot_runs(args.runs, args.out, args.x, args.summary, keep, points)
    except (ValueError, OSError) as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

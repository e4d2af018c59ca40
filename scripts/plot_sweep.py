#!/usr/bin/env python3
"""Plot a sweep's results.csv (written by `llmtrain sweep`, docs/SWEEPS.md): one metric against one override key.

Usage: scripts/plot_sweep.py SWEEP_DIR [--x KEY] [--metric best_val_loss] [--out sweep.png] [--summary]

The x axis is the override key KEY (default: the first override column of results.csv), logarithmic when its
values are positive and span more than a factor of 10 (learning rates); every combination of the other override
keys is one line, labelled with it. Only finished points are drawn; a metric cell that is empty or not a number
is left out. --summary prints each line's points (what was drawn). The run-by-run curves of the same points:
scripts/plot_metrics.py SWEEP_DIR/*/
"""
import argparse
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_util import pyplot  # noqa: E402

plt = pyplot(__file__, "plot_sweep")

METRICS = ["best_val_loss", "final_val_loss", "tokens_per_s", "final_val_acc", "final_val_scaled_acc"]


def read_results(sweep_dir):
    """(override keys, rows as dicts) of SWEEP_DIR/results.csv; the override keys are the columns between
    `point` and `status`. Raises ValueError naming the file when it is missing or not a sweep table."""
    path = os.path.join(sweep_dir, "results.csv")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not found (is {sweep_dir} a sweep directory?)")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][:1] != ["point"] or "status" not in rows[0]:
        raise ValueError(f"{path}: not a sweep results table (its header must start with point and hold status)")
    header = rows[0]
    keys = header[1:header.index("status")]
    return keys, [dict(zip(header, r)) for r in rows[1:]]


def number(text):
    """The float in `text`, or None when it is empty or not a finite number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def sweep_lines(keys, rows, x_key, metric):
    """{label: [(x, y), ...] sorted by x} of the finished rows; the label names the other keys' values."""
    lines = {}
    for r in rows:
        if r.get("status") != "finished":
            continue
        x, y = number(r.get(x_key, "")), number(r.get(metric, ""))
        if x is None or y is None:
            continue
        label = ", ".join(f"{k}={r[k]}" for k in keys if k != x_key and r.get(k)) or metric
        lines.setdefault(label, []).append((x, y))
    return {label: sorted(points) for label, points in lines.items()}


def plot_sweep(sweep_dir, out, x_key=None, metric="best_val_loss", summary=False):
    keys, rows = read_results(sweep_dir)
    if not keys:
        raise ValueError(f"{sweep_dir}/results.csv has no override column")
    x_key = x_key or keys[0]
    if x_key not in keys:
        raise ValueError(f"--x {x_key}: not an override key of this sweep (keys: {', '.join(keys)})")
    lines = sweep_lines(keys, rows, x_key, metric)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [x for points in lines.values() for x, _ in points]
    for label, points in lines.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        if summary:
            print(f"{label}: " + " ".join(f"{x!r}:{y!r}" for x, y in points))
    if xs and min(xs) > 0 and max(xs) > 10 * min(xs):
        ax.set_xscale("log")
    ax.set_xlabel(x_key)
    ax.set_ylabel(metric)
    ax.set_title(os.path.basename(os.path.normpath(sweep_dir)))
    ax.grid(True, alpha=0.3)
    if lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", metavar="SWEEP_DIR", help="directory holding results.csv")
    parser.add_argument("--x", dest="x_key", help="override key on the x axis (default: the first)")
    parser.add_argument("--metric", choices=METRICS, default="best_val_loss", help="y axis (default best_val_loss)")
    parser.add_argument("--out", default="sweep.png", help="image file to write (default sweep.png)")
    parser.add_argument("--summary", action="store_true", help="print the points of each line")
    args = parser.parse_args(argv)
    try:
        plot_sweep(args.sweep, args.out, args.x_key, args.metric, args.summary)
    except (ValueError, OSError) as e:
        print(f"plot_sweep: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

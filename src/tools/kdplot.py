#!/usr/bin/env python3
"""kdplot: the curves of one or more kdtrain runs (their metrics.csv) in one PNG.

    kdplot [-o OUT.png] [--title TEXT] RUN [RUN ...]

RUN is a metrics.csv file or a run%out_dir holding one; NAME=RUN labels it NAME
(default: the directory name). Four panels: the cross entropy on the data, training
(loss_ce) and, dashed, validation (val_loss), comparable across runs whether they
distil or not; learning rate; tokens/s; and, for distilled runs, the objective they
minimise (loss = alpha * kd + (1 - alpha) * ce) with its two parts. Needs matplotlib.
Exit status: 0 done, 2 bad input (no such file, not a kdtrain metrics file).
"""
import argparse
import csv
import os
import sys

COLUMNS = "step,loss,loss_kd,loss_ce,lr,grad_norm,skipped,tokens,tok_per_s,mfu,mem_peak_bytes,val_loss"


def fail(msg, status=2):
    print(f"kdplot: {msg}", file=sys.stderr)
    sys.exit(status)


def read_run(spec):
    """(label, {column: [(step, value)]}) of one RUN argument."""
    label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.csv")
    if not label:
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    # later columns (loss_aux, ...) are appended: the file starts with these
    if not rows or ",".join(rows[0][:len(COLUMNS.split(","))]) != COLUMNS:
        fail(f"{path}: not a kdtrain metrics file (expected the header {COLUMNS})")
    head = rows[0]
    series = {c: [] for c in head[1:]}
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(head):
            fail(f"{path}:{n}: {len(row)} fields, expected {len(head)}")
        try:
            step = int(row[0])
            for c, v in zip(head[1:], row[1:]):
                if v != "":
                    series[c].append((step, float(v)))
        except ValueError as e:
            fail(f"{path}:{n}: {e}")
    return label, series


def main():
    ap = argparse.ArgumentParser(prog="kdplot", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="RUN: a metrics.csv, a run%out_dir, or NAME=either")
    ap.add_argument("runs", nargs="+", metavar="RUN")
    ap.add_argument("-o", "--output", default="kdplot.png", help="PNG to write (default kdplot.png)")
    ap.add_argument("--title", default="", help="figure title")
    args = ap.parse_args()
    runs = [read_run(r) for r in args.runs]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("needs matplotlib (`make tools-env` installs the tools' packages: README.md; "
             "or Debian: apt-get install python3-matplotlib)", 3)

    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [(ax[0][0], "loss_ce", "cross entropy (nats/token): training, validation dashed"),
              (ax[0][1], "lr", "learning rate"), (ax[1][0], "tok_per_s", "tokens/s"),
              (ax[1][1], "parts", "distillation objective (loss) and its parts (nats/token)")]
    for i, (label, s) in enumerate(runs):
        color = f"C{i}"
        for a, col, _ in panels:
            if col == "parts":
                if s["loss_kd"]:  # a distilled run: its objective, kd and ce
                    for part, style, name in (("loss", "-", "objective"), ("loss_kd", "--", "kd"),
                                              ("loss_ce", ":", "ce")):
                        if s[part]:
                            x, y = zip(*s[part])
                            a.plot(x, y, style, color=color, label=f"{label} {name}")
                continue
            if s[col]:
                x, y = zip(*s[col])
                a.plot(x, y, "-", color=color, label=f"{label} train" if col == "loss_ce" else label)
            if col == "loss_ce" and s["val_loss"]:
                x, y = zip(*s["val_loss"])
                a.plot(x, y, "--o", color=color, markersize=3, label=f"{label} valid")
    for a, col, title in panels:
        a.set_title(title)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
        if a.lines:
            a.legend(fontsize=8)
    # the cross-entropy panel from the lowest value to a little above the highest validation
    # loss: the first steps' loss would squeeze the curves a reader compares into one line
    vals = [v for _, s in runs for _, v in s["val_loss"]]
    ces = [v for _, s in runs for _, v in s["loss_ce"]]
    if vals and ces:
        lo, hi = min(ces + vals), max(vals)
        ax[0][0].set_ylim(lo - 0.1 * (hi - lo), hi + 0.6 * (hi - lo))
    ax[0][1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=100)
    except OSError as e:
        fail(f"{args.output}: {e.strerror}", 3)
    print(f"kdplot: wrote {args.output} ({len(runs)} run(s))")


if __name__ == "__main__":
    main()

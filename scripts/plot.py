#!/usr/bin/env python3
"""Draws pgfifo's benchmark figures from saved results.

Reads every `*.json` file in crates/bench/results/ (each holds the JSON lines
that `pgfifo-bench` printed, one run per line) and draws:

* docs/perf-backlog.png: pick cost (median and p99, ms) against backlog size,
  from `backlog` runs, log x axis;
* docs/perf-workers.png: drain throughput (jobs/s) against workers, from
  `fifo-groups` runs, with the server's single-row UPDATE ceiling when the
  runs measured it.

A figure without data is skipped with a message, not an error.

    python3 scripts/plot.py [--results DIR] [--out DIR]

Needs matplotlib (`pip install matplotlib`).
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_runs(results_dir):
    """Every JSON object in results_dir/*.json, as (label, object) pairs.

    A file is read as JSON lines; a file that is one pretty-printed object
    (or a list of them) is accepted too. Unreadable lines are reported and
    skipped.
    """
    runs = []
    if not results_dir.is_dir():
        print(f"plot: no results directory {results_dir}", file=sys.stderr)
        return runs
    for path in sorted(results_dir.glob("*.json")):
        text = path.read_text(encoding="utf-8", errors="replace")
        objects = []
        bad = 0
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                objects.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
        if bad:
            try:
                whole = json.loads(text)
                objects = whole if isinstance(whole, list) else [whole]
                bad = 0
            except json.JSONDecodeError:
                pass
        if bad:
            print(f"plot: {path.name}: skipped {bad} line(s) that are not JSON", file=sys.stderr)
        objects = [o for o in objects if isinstance(o, dict)]
        for i, obj in enumerate(objects):
            label = path.stem if len(objects) == 1 else f"{path.stem} #{i + 1}"
            runs.append((label, obj))
    return runs


def plot_backlog(runs, out, plt):
    series = [(label, run) for label, run in runs if run.get("scenario") == "backlog" and run.get("results")]
    if not series:
        print("plot: no backlog results; skipping perf-backlog.png")
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, run in series:
        rows = sorted(
            (r for r in run["results"] if "jobs" in r and "pick_median_ms" in r),
            key=lambda r: r["jobs"],
        )
        if not rows:
            continue
        jobs = [r["jobs"] for r in rows]
        (line,) = ax.plot(jobs, [r["pick_median_ms"] for r in rows], marker="o", label=f"{label}: median")
        if all("pick_p99_ms" in r for r in rows):
            ax.plot(
                jobs,
                [r["pick_p99_ms"] for r in rows],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{label}: p99",
            )
        for r in rows:
            ax.annotate(
                f"{r.get('groups', '?')} groups",
                (r["jobs"], r["pick_median_ms"]),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=7,
                color=line.get_color(),
            )
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("queued jobs (log scale)")
    ax.set_ylabel("one pick (ms)")
    ax.set_title("pgfifo: pick cost against backlog size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = out / "perf-backlog.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    print(f"plot: wrote {target}")
    return True


def plot_workers(runs, out, plt):
    by_label = defaultdict(lambda: defaultdict(list))
    ceilings = []
    for label, run in runs:
        if run.get("scenario") != "fifo-groups":
            continue
        if "workers" not in run or "drain_jobs_per_s" not in run:
            continue
        by_label[label.split(" #")[0]][run["workers"]].append(run["drain_jobs_per_s"])
        if run.get("ceiling_tps"):
            ceilings.append(run["ceiling_tps"])
    if not by_label:
        print("plot: no fifo-groups results; skipping perf-workers.png")
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(by_label.items()):
        workers = sorted(points)
        medians = [statistics.median(points[w]) for w in workers]
        (line,) = ax.plot(workers, medians, marker="o", label=f"{label} (median)")
        scatter_x = [w for w in workers for _ in points[w]]
        scatter_y = [v for w in workers for v in points[w]]
        if len(scatter_x) > len(workers):
            ax.scatter(scatter_x, scatter_y, s=12, alpha=0.4, color=line.get_color())
    if ceilings:
        ax.axhline(
            statistics.median(ceilings),
            color="gray",
            linestyle="--",
            label="single-row UPDATE ceiling (median)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({w for points in by_label.values() for w in points}))
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("workers (jobs running at once, log scale)")
    ax.set_ylabel("drain throughput (jobs/s)")
    ax.set_title("pgfifo: drain throughput against workers (fifo-groups)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = out / "perf-workers.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    print(f"plot: wrote {target}")
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "crates" / "bench" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()

    runs = load_runs(args.results)
    if not runs:
        print(f"plot: no results in {args.results}; nothing to draw")
        return 0
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is missing; install it with `pip install matplotlib`", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    plot_backlog(runs, args.out, plt)
    plot_workers(runs, args.out, plt)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`spotrun audit --plot`: cumulative spend against the baseline, reclaims marked."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from spotrun.audit.compute import JobAudit
from spotrun.errors import BadInputError

MAX_PANELS = 8


def cumulative_curve(spans: list[tuple[datetime, datetime, float]]
                     ) -> tuple[list[datetime], list[float]]:
    """Piecewise-linear running total: each (start, end, usd) accrues evenly over its span."""
    events: dict[datetime, list[float]] = {}   # t -> [slope change (usd/s), jump (usd)]
    for start, end, usd in spans:
        secs = (end - start).total_seconds()
        if secs > 0:
            events.setdefault(start, [0.0, 0.0])[0] += usd / secs
            events.setdefault(end, [0.0, 0.0])[0] -= usd / secs
        else:
            events.setdefault(end, [0.0, 0.0])[1] += usd
    xs: list[datetime] = []
    ys: list[float] = []
    cum, slope, prev = 0.0, 0.0, None
    for t in sorted(events):
        if prev is not None:
            cum += slope * (t - prev).total_seconds()
        xs.append(t)
        ys.append(cum)
        d_slope, jump = events[t]
        if jump:
            cum += jump
            xs.append(t)
            ys.append(cum)
        slope += d_slope
        prev = t
    return xs, ys


def plot_audit(jobs: list[JobAudit], path: str | Path) -> Path:
    """Write a PNG with one panel per job (the first MAX_PANELS jobs)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.suffix.lower() != ".png":
        raise BadInputError("allowed: a file name ending in .png", field="--plot", value=str(path))
    shown = jobs[:MAX_PANELS]
    n = max(len(shown), 1)
    fig, axes = plt.subplots(n, 1, figsize=(9, 3.2 * n), squeeze=False)
    for ax, job in zip(axes[:, 0], shown):
        _panel(ax, job, mdates)
    if not shown:
        axes[0, 0].text(0.5, 0.5, "no jobs", ha="center", va="center")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _panel(ax, job: JobAudit, mdates) -> None:
    if job.spend_spans:
        xs, ys = cumulative_curve(job.spend_spans)
        ax.plot(xs, ys, color="tab:blue", label=f"actual ${job.actual_usd:.2f}")
    if job.baseline_spans:
        xs, ys = cumulative_curve(job.baseline_spans)
        ax.plot(xs, ys, color="tab:orange", linestyle="--",
                label=f"on-demand baseline ${job.baseline_on_demand_usd:.2f}")
    for i, t in enumerate(job.reclaims):
        ax.axvline(t, color="tab:red", alpha=0.6, linewidth=1,
                   label="reclaim" if i == 0 else None)
    saved = "" if job.saved_fraction is None else f", saved {job.saved_fraction * 100:.0f}%"
    ax.set_title(f"{job.id} ({job.state}): {job.preemptions} preemption(s){saved}", fontsize=10)
    ax.set_ylabel("cumulative USD")
    ax.set_xlabel("provider time (UTC)" if job.time_scale == 1.0 else
                  f"market time (UTC; the market runs up to x{job.time_scale:g} the wall)")
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.grid(alpha=0.3)
    if job.spend_spans or job.baseline_spans:
        ax.legend(loc="upper left", fontsize=8)

"""``transfer.json``, ``transfer.md`` and ``transfer.png``."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

from nas.units import si
from runners.checkpoint import save_figure

from .analysis import ScaleResult, Transfer, extrapolation_sentence, shown

OUTCOMES = ("kept", "flipped", "within_noise", "newly_separated", "still_within_noise")


def write(t: Transfer, out: Path) -> list[Path]:
    from runners.results.records import write_json, write_text

    paths = [out / "transfer.json", out / "transfer.md", out / "transfer.png"]
    write_json(paths[0], t)
    write_text(paths[1], markdown(t))
    figure(t, paths[2])
    return paths


def _q(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def _corr(value: float | None, ci) -> str:
    return "—" if value is None else f"{value:.2f}" + ("" if ci is None else f" ({ci[0]:.2f}–{ci[1]:.2f})")


def scale_rows(t: Transfer) -> list[tuple[str, ...]]:
    """One row per scale: budget, τ, ρ, the pairs and the front (the markdown's and the terminal's)."""
    rows = []
    for r in t.scales:
        p = r.pairs
        base = r is t.scales[0]
        kept = (f"{p.separated} of {p.separated + p.unseparated} pairs separated" if base else
                f"{p.kept} / {p.flipped} / {p.within_noise} of {p.separated}")
        budget = f"{r.steps} steps" if r.steps is not None else f"{r.tokens} tokens"
        rows.append((shown(r.label), budget, f"{r.compared}", "(base)" if base else _corr(r.tau, r.tau_ci),
                     "(base)" if base else _corr(r.spearman, r.spearman_ci), kept,
                     "" if base else f"{p.newly_separated} of {p.unseparated}", ", ".join(r.front) or "—"))
    return rows


SCALE_COLUMNS = ("scale", "budget", "compared", "Kendall τ (95% CI)", "Spearman ρ (95% CI)",
                 "separated at base: kept / flipped / within noise", "within noise at base: now separated", "front")


def candidate_rows(t: Transfer) -> tuple[list[str], list[tuple[str, ...]]]:
    """Per candidate: quality ± s.e. and unique parameters at each scale."""
    head = ["candidate"] + [f"{t.metric} at {shown(r.label)} (params)" for r in t.scales] + ["architecture (base)"]
    rows = []
    for i, c in enumerate(t.scales[0].candidates):
        cells = [c.label]
        for r in t.scales:
            x = r.candidates[i]
            cells.append(f"{_q(x.mean, x.se)} ({si(x.unique_params)})" if x.mean is not None else x.status)
        cells.append(c.summary or "")
        rows.append(tuple(cells))
    return head, rows


def markdown(t: Transfer) -> str:
    base = t.scales[0]
    lines = [f"# Does the ranking of `{t.space}` hold at larger scale?", "", f"**{t.verdict}**", "",
             f"{len(base.candidates)} candidates ({t.candidates_rule}) of `{t.experiment}` × {t.seeds} seeds, "
             f"metric `{t.metric}` ({t.direction}). Widths grown by `nas.budget.scale_arch` (heads and FFN "
             f"widths with them). Rules: {t.rules}. A pair differs beyond seed noise when its test "
             f"(`nas.noise.compare`: paired t over shared seeds, else Welch) gives p < {t.alpha:g}.", ""]
    lines += ["| " + " | ".join(SCALE_COLUMNS) + " |", "|" + "---|" * len(SCALE_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in scale_rows(t)] + [""]
    lines += [f"- {shown(r.label)}: {r.verdict}" for r in t.scales[1:]] + [""]
    head, rows = candidate_rows(t)
    lines += ["## Candidates", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    for r in t.scales[1:]:
        moved = [d for d in r.pairs.detail if d.outcome in ("flipped", "within_noise", "newly_separated")]
        if moved:
            lines += [f"Pairs that changed at {shown(r.label)} (difference a − b, p):", ""]
            lines += [f"- {d.a} − {d.b}: {_num(d.base_diff)} (p = {_num(d.base_p)}) at the base, "
                      f"{_num(d.diff)} (p = {_num(d.p)}) at {shown(r.label)}: {d.outcome.replace('_', ' ')}"
                      for d in moved] + [""]
    if t.extrapolation is not None:
        e = t.extrapolation
        lines += ["## Extrapolated (not measured)", "", extrapolation_sentence(e), "", e.note, "",
                  "| candidate | predicted | interval | slope per e× params |", "|---|---|---|---|"]
        lines += [f"| {p.label} | {p.predicted:.3f} | {p.lo:.3f}–{p.hi:.3f} | {p.slope:.3g} |" for p in e.candidates]
        lines.append("")
    lines += [f"Note: {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3g}"


def figure(t: Transfer, path: Path) -> Path:
    """Quality against unique parameters, one line per candidate (±1 s.e.; the base front
    solid, its rivals dashed; an extrapolation dotted to its target), and beside it each
    scale's pair outcomes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5.6))
    ax, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    base = t.scales[0]
    colours = [f"C{i % 10}" for i in range(len(base.candidates))]
    for i, c in enumerate(base.candidates):
        pts = [(r.candidates[i].unique_params, r.candidates[i].mean, r.candidates[i].se or 0.0)
               for r in t.scales if r.candidates[i].mean is not None and r.candidates[i].unique_params]
        if not pts:
            continue
        x, y, e = zip(*pts)
        style = "-" if c.label in base.front else "--"
        ax.errorbar(x, y, yerr=e, fmt="o" + style, color=colours[i], capsize=3, lw=1.6, ms=5,
                    label=f"{c.label}{' (base front)' if c.label in base.front else ''}")
        pred = next((p for p in t.extrapolation.candidates if p.label == c.label), None) if t.extrapolation else None
        if pred is not None:
            ax.plot([x[-1], pred.params], [y[-1], pred.predicted], ":", color=colours[i], lw=1.2)
            ax.errorbar([pred.params], [pred.predicted], yerr=[[pred.predicted - pred.lo], [pred.hi - pred.predicted]],
                        fmt="D", color=colours[i], mfc="white", capsize=3, ms=5)
    if t.extrapolation is not None:
        trained = max(c.unique_params or 0 for r in t.scales for c in r.candidates)
        ax.axvspan(trained, t.extrapolation.target, color="#000000", alpha=0.05, lw=0)
        ax.text(t.extrapolation.target, ax.get_ylim()[0], "extrapolated ", ha="right", va="bottom", fontsize=8,
                color="#555555")
    ax.set_xscale("log")
    ax.set_xlabel("unique parameters (log)" + (" — open diamonds: EXTRAPOLATED" if t.extrapolation else ""))
    ax.set_ylabel(f"{t.metric} ({'higher' if t.direction == 'maximize' else 'lower'} is better), mean ± s.e.")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16), ncol=4,
              title="solid: base front · dashed: rivals", title_fontsize=7)
    _pair_bars(bars, t.scales[1:])
    fig.suptitle("\n".join(textwrap.wrap(f"{t.space}: {t.verdict}", 120)), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=150, facecolor="white")
    return path


def _pair_bars(ax, scales: list[ScaleResult]) -> None:
    """Stacked bars per scale: what became of the base's separated and unseparated pairs."""
    colours = {"kept": "#2ca02c", "flipped": "#d62728", "within_noise": "#ffbf00",
               "newly_separated": "#1f77b4", "still_within_noise": "#c7c7c7"}
    names = [f"{shown(r.label)}\n" + ("τ = —" if r.tau is None else f"τ = {r.tau:.2f}") +
             ("" if r.tau_ci is None else f"\n({r.tau_ci[0]:.2f}–{r.tau_ci[1]:.2f})") for r in scales]
    bottom = [0.0] * len(scales)
    for o in OUTCOMES:
        h = [getattr(r.pairs, o) for r in scales]
        ax.bar(names, h, bottom=bottom, color=colours[o], label=o.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_ylabel("pairs of candidates")
    ax.set_title("what became of the base's pairs\n(τ and its 95% CI below each scale)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.3), ncol=2)


__all__ = ["OUTCOMES", "SCALE_COLUMNS", "candidate_rows", "figure", "markdown", "scale_rows", "write"]

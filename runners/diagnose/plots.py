"""PNG plots of a diagnostics summary (matplotlib, no pyplot state)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from runners.checkpoint import save_figure


def _mixer_axis(ax, rows: list[dict]) -> None:
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r in rows], rotation=60, ha="right", fontsize=7)
    for i in range(1, len(rows)):
        if rows[i]["layer"] != rows[i - 1]["layer"]:
            ax.axvline(i - 0.5, color="0.7", lw=0.8)


def interventions(summary: dict, path: Path) -> None:
    rows = summary["interventions"]
    fig = Figure(figsize=(max(6, 0.45 * len(rows) + 2), 5.5), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(rows))
    ax1.bar(x, [r["kl"] for r in rows], color=["C0" if r["looped"] else "0.6" for r in rows])
    ax1.set_ylabel("KL(intact ‖ closed), nats")
    ax1.set_title(f"{summary['arch']}: context-closed intervention per mixer application")
    ax2.bar(x, [r["d_loss"] for r in rows], color="C3")
    ax2.axhline(0, color="k", lw=0.6)
    ax2.set_ylabel("Δ loss (closed − intact)")
    _mixer_axis(ax2, rows)
    save_figure(fig, path, dpi=120)


def truncation(summary: dict, path: Path) -> None:
    rows = summary["truncation"]
    ks = [r["k"] for r in rows]
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(ks, [r["loss"] for r in rows], "o-", label="eval loss")
    ax1.set_xlabel("loops k (every region)")
    ax1.set_ylabel("eval loss")
    ax1.set_xticks(ks)
    if summary["quality_metric"] != "eval_loss":
        axq = ax1.twinx()
        axq.plot(ks, [r["quality"] for r in rows], "s--", color="C2", label=summary["quality_metric"])
        axq.set_ylabel(summary["quality_metric"], color="C2")
    elastic = summary["elastic_eval"]
    ax1.set_title("elastic curve (trained elastic)" if elastic else "quality vs loop count (not trained elastic)",
                  fontsize=9)
    nxt = [r for r in rows if "kl_next" in r]
    ax2.bar([r["k"] + 0.5 for r in nxt], [r["kl_next"] for r in nxt], width=0.4)
    ax2.set_xticks([r["k"] + 0.5 for r in nxt], [f"{r['k']}→{r['k'] + 1}" for r in nxt])
    ax2.set_ylabel("KL(p_k+1 ‖ p_k), nats")
    ax2.set_title("what iteration k+1 adds at the output", fontsize=9)
    fig.suptitle(summary["arch"])
    save_figure(fig, path, dpi=120)


def transport(summary: dict, path: Path) -> None:
    rows = summary["transport"]
    looped = [r for r in rows if r["looped"]] or rows
    layers = sorted({r["layer"] for r in looped})
    per_layer = max(len([r for r in looped if r["layer"] == layer]) for layer in layers)
    fig = Figure(figsize=(max(8, 1.8 * per_layer + 4), 3 + 1.8 * len(layers)), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.3, len(layers)])
    ax1, ax2 = top.subplots(1, 2)
    x = np.arange(len(rows))
    ax1.plot(x, [r["erank"] for r in rows], "o-", label="erank(C) after")
    ax1.plot(x, [r["new_erank"] for r in rows], "s--", label="erank(ΔC)")
    ax1.set_ylabel("effective rank")
    ax1.legend(fontsize=7)
    ax2.bar(x, [r["new"] for r in rows])
    ax2.set_ylabel("new: ‖ΔC‖/‖C‖")
    for ax in (ax1, ax2):
        _mixer_axis(ax, rows)
    top.suptitle(f"{summary['arch']}: cross-position influence C[t,s] = ‖∂h_t/∂x_s‖ (off-diagonal)",
                 fontsize=10)
    axes = np.atleast_2d(bottom.subplots(len(layers), per_layer, squeeze=False))
    vmax = max(max(max(row) for row in r["C"]) for r in looped) or 1.0
    for i, layer in enumerate(layers):
        mine = [r for r in looped if r["layer"] == layer]
        for j, ax in enumerate(axes[i]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j < len(mine):
                im = ax.imshow(np.array(mine[j]["C"]), vmin=0, vmax=vmax, cmap="viridis")
                ax.set_title(mine[j]["label"], fontsize=8)
            else:
                ax.axis("off")
    bottom.colorbar(im, ax=axes, shrink=0.8, label="C[t, s] (row t: output, col s: input)")
    save_figure(fig, path, dpi=120)


def _loop_edges(rows: list[dict]) -> list[int]:
    """Points where an outermost loop iteration starts (the label's τ changes)."""
    its = [r["label"].split("@τ")[1] if "@τ" in r["label"] else None for r in rows]
    return [i for i in range(1, len(its)) if its[i] is not None and its[i - 1] is not None and its[i] != its[i - 1]]


def traces(summary: dict, path: Path) -> None:
    rows, off = summary["traces"], summary.get("traces_gate_off")
    attn = any(r["first_token_mass"] is not None for r in rows)
    n = 3 if attn else 2
    fig = Figure(figsize=(max(7, 0.3 * len(rows) + 2), 2.3 * n + 1), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True)
    x = np.arange(len(rows))
    series = [("with gate" if off else "", rows)] + ([("gate bypassed (ablation)", off)] if off else [])
    k = 0
    if attn:
        for name, rs in series:
            pts = [(i, r["first_token_mass"]) for i, r in enumerate(rs) if r["first_token_mass"] is not None]
            axes[0].plot(*zip(*pts), "o-", label=name)
        axes[0].set_ylabel("first-token attn mass")
        k = 1
    for name, rs in series:
        axes[k].semilogy(x, [r["max_abs"] for r in rs], ".-", label=name)
        axes[k + 1].plot(x, [r["rms"] for r in rs], ".-", label=name)
    axes[k].set_ylabel("max |h| (log)")
    axes[k + 1].set_ylabel("residual RMS")
    for ax in axes:
        for e in _loop_edges(rows):
            ax.axvline(e - 0.5, color="0.5", ls="--", lw=0.8)
        if off:
            ax.legend(fontsize=7)
    step = max(1, len(rows) // 40)
    axes[-1].set_xticks(x[::step], [r["label"] for r in rows][::step], rotation=70, ha="right", fontsize=6)
    axes[0].set_title(f"{summary['arch']}: traces along the unrolled depth (dashed: loop iterations)")
    save_figure(fig, path, dpi=120)


def write_plots(summary: dict, out: Path) -> list[str]:
    """Write every plot the summary has data for; returns the file names."""
    made = []
    for name, fn, key in (("interventions.png", interventions, "interventions"),
                          ("truncation.png", truncation, "truncation"),
                          ("transport.png", transport, "transport"),
                          ("traces.png", traces, "traces")):
        if summary.get(key):
            fn(summary, out / name)
            made.append(name)
    return made


__all__ = ["write_plots"]

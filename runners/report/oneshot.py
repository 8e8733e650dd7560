"""A one-shot sweep's self-check (``runners.oneshot.check``) as ``status`` and the report
show it: read from ``EXP/oneshot.json`` (no torch)."""
from __future__ import annotations

import json
from html import escape
from pathlib import Path

SUMMARY = "oneshot.json"


def read_check(exp_dir: str | Path) -> dict | None:
    """The self-check's result (``tau``, ``tau_ci``, ``p``, ``n``, ``seeds``, ``verdict``, ...),
    or None: not a one-shot sweep, or its check has not run yet."""
    from runners.results.records import MAX_EXPERIMENT, Skipped, read_bounded

    path = Path(exp_dir) / SUMMARY
    try:  # bounded, regular files only: a FIFO or a device there is no check, not a hang
        check = json.loads(read_bounded(path, MAX_EXPERIMENT)).get("check")
    except (OSError, ValueError, AttributeError, Skipped):
        return None
    return check if isinstance(check, dict) else None


def _num(x: float | None, se: float | None = None) -> str:
    if x is None:
        return "—"
    return f"{x:.4g}" + (f" ± {se:.2g}" if se else "")


def check_section(exp_dir: str | Path | None) -> str:
    """The report's section: the verdict and each spot-checked sub-network, one-shot score
    beside its stand-alone runs ('' when there is no self-check)."""
    check = read_check(exp_dir) if exp_dir is not None else None
    if check is None:
        return ""
    style = "noise" if check.get("agrees") else "note"
    html = f"<p class='{style}'><b>Self-check.</b> {escape(check['verdict'])}</p>"
    rows = check.get("candidates") or []
    if not rows:
        return html
    metric = escape(check.get("metric", "quality"))
    head = (f"<tr><th>one-shot rank</th><th>trial</th><th>architecture</th><th>one-shot {metric}</th>"
            f"<th>stand-alone {metric} (mean ± s.e.)</th><th>per seed</th><th>stand-alone trial</th></tr>")
    body = "".join(
        f"<tr><td class='num'>{r['oneshot_rank']} of {check.get('ranked', '?')}</td><td>{escape(r['trial'])}</td>"
        f"<td>{escape(r.get('summary') or '')}</td><td class='num'>{_num(r['oneshot'])}</td>"
        f"<td class='num'>{_num(r['mean'], r.get('se'))}</td>"
        f"<td class='num'>{' / '.join(f'{v:.4g}' for v in r['values'])}</td>"
        f"<td>{escape(check.get('dir', 'check'))}/{escape(r['standalone_trial'])}</td></tr>" for r in rows)
    where = escape(check.get("dir", "check"))
    return (html + f"<table>{head}{body}</table><p class='meta'>The stand-alone runs are an ordinary "
            f"experiment in <code>{where}/</code> (seeds {escape(str(rows[0]['seeds']))}): "
            f"<code>loopnas report EXP/{where}</code>, or <code>loopnas export EXP/{where} --pick knee</code> "
            "for the stand-alone front. τ is one-sided (agreement means τ &gt; 0); its interval resamples "
            "the stand-alone seeds.</p>")


__all__ = ["check_section", "read_check"]

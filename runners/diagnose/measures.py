"""What each loop iteration contributes, measured on a compiled model and fixed batches.

Definitions (all logits are turned into log-probabilities first; KL in nats, averaged over
the scored positions, i.e. labels != -100, or over every position when none is scored):

- **context-closed intervention** (MixerLoop §3.4) at mixer application (ℓ, n): that one
  application is replaced by :func:`probes.context_closed` and we report
  ``kl = KL(p_intact ‖ p_intervened)`` of the final next-token distribution, ``d_loss =
  loss_intervened − loss_intact`` and ``d_quality`` (the task's quality metric).
- **truncation**: the model run with every loop region at ``k`` loops, ``k = 1..K``;
  ``kl_next = KL(p_{k+1} ‖ p_k)`` and ``d_loss_next = loss_{k+1} − loss_k`` are what the
  ``(k+1)``-th iteration adds at the output.
- **transport** (a Jacobian form of MixerLoop's iteration transport): for one sequence,
  ``x`` the embedding output and ``h`` the residual stream at a point of the unrolled depth,
  ``M[t, s] = ‖∂h_t/∂x_s‖_F`` (D×D block norms by batched backward passes: exact, or
  estimated from ``probes`` Gaussian vectors per position, ‖J‖_F² = E‖vᵀJ‖²); causal,
  so lower triangular. ``C`` is ``M`` with its diagonal zeroed: the accumulated
  *cross-position* influence. For mixer application ``a``, with ``C_in`` at its input and
  ``C_out`` at the next point (after it, and after any loop update / re-injection that
  follows): ``erank = exp(H(σ/Σσ))`` of ``C_out`` (σ its singular values; 1 ≤ erank ≤
  T − 1), ``cross_frac = ‖C_out‖_F / ‖M_out‖_F``, ``new = ‖C_out − C_in‖_F / ‖C_out‖_F``
  (relative new cross-position influence) and ``new_erank = erank(C_out − C_in)``.
- **traces** (LT2 Fig. 5) at every point: residual RMS ``sqrt(mean h²)``, max ``|h|``, and
  for plain softmax-attention applications the first-token mass: the mean over batch,
  heads and queries ``t ≥ 1`` of ``softmax(q kᵀ/√d)[t, 0]``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .probes import App, applications, capture, closed_at


def _scored(labels: torch.Tensor) -> torch.Tensor:
    mask = labels != -100
    return mask if mask.any() else torch.ones_like(mask)


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(P ‖ Q) in nats per scored position."""
    lp, lq = F.log_softmax(p_logits.float(), -1), F.log_softmax(q_logits.float(), -1)
    per = (lp.exp() * (lp - lq)).sum(-1)  # (B, T)
    return (per[mask].sum() / mask.sum()).clamp_min(0.0).item()


class Evaluator:
    """Fixed batches, the task's metrics, and the intact outputs they are compared with."""

    def __init__(self, model, batches, task=None, quality_metric: str = "eval_loss", seed: int = 0):
        self.model, self.batches, self.task = model, batches, task
        self.quality_metric, self.seed = quality_metric, seed

    @torch.no_grad()
    def run(self, loops: int | None = None) -> tuple[list[torch.Tensor], dict[str, float]]:
        """Logits per batch and mean metrics (``eval_loss`` + the task's) at ``loops``."""
        logits, sums = [], {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)  # random placement votes on the same patterns
            for x, y in self.batches:
                out = self.model(x, y, loops=loops)
                logits.append(out.logits)
                m = {"eval_loss": out.ce_loss.item()}
                if self.task is not None:
                    m.update(self.task.metrics(out.logits.float(), y))
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v / len(self.batches)
        return logits, sums

    def kl(self, ref: list[torch.Tensor], other: list[torch.Tensor]) -> float:
        return sum(kl(a, b, _scored(y)) for a, b, (_, y) in zip(ref, other, self.batches)) / len(ref)

    def quality(self, metrics: dict[str, float]) -> float:
        return metrics.get(self.quality_metric, metrics["eval_loss"])


def interventions(ev: Evaluator, loops: int | None = None) -> list[dict]:
    """One row per mixer application: the context-closed intervention's effect."""
    ref, base = ev.run(loops)
    rows = []
    for app in applications(ev.model, loops):
        if app.op != "mixer":
            continue
        with closed_at(ev.model, app.layer, app.nth):
            out, m = ev.run(loops)
        rows.append({"application": app.index, "label": app.label(), "layer": app.layer,
                     "iteration": app.iteration, "looped": app.looped, "kl": ev.kl(ref, out),
                     "d_loss": m["eval_loss"] - base["eval_loss"],
                     "d_quality": ev.quality(m) - ev.quality(base)})
    return rows


def truncation(ev: Evaluator, max_k: int) -> list[dict]:
    """Loss and quality at every loop count ``k = 1..max_k``, and what iteration ``k + 1`` adds."""
    runs = [ev.run(k) for k in range(1, max_k + 1)]
    rows = []
    for k, (logits, m) in enumerate(runs, start=1):
        row = {"k": k, "loss": m["eval_loss"], "quality": ev.quality(m),
               "kl_to_max": ev.kl(runs[-1][0], logits)}
        if k < max_k:
            nxt_logits, nxt = runs[k]
            row.update(kl_next=ev.kl(nxt_logits, logits), d_loss_next=nxt["eval_loss"] - m["eval_loss"])
        rows.append(row)
    return rows


def effective_rank(m: torch.Tensor) -> float:
    """exp of the entropy of the normalised singular values (Roy & Vetterli); 0 for m = 0."""
    s = torch.linalg.svdvals(m.double())
    if s.sum() <= 1e-12 * max(1.0, m.abs().max().item()):
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return math.exp(-(p * p.log()).sum().item())


def _influence(h: torch.Tensor, x: torch.Tensor, probes: int | None = None) -> torch.Tensor:
    """M[t, s] = ‖∂h[0, t]/∂x[0, s]‖_F for h, x (1, T, D): exact (one backward per output
    unit), or with ``probes`` Gaussian vectors v per output position, using
    ‖J‖_F² = E‖vᵀJ‖² (unbiased; exactly 0 where J = 0)."""
    t, d = h.shape[1], h.shape[2]
    k = d if probes is None else probes
    if probes is None:
        v = torch.eye(d, dtype=h.dtype).expand(t, d, d)  # (T, K, D)
    else:
        v = torch.randn(t, k, d, dtype=h.dtype, generator=torch.Generator().manual_seed(0))
    grad_out = torch.zeros(t, k, 1, t, d, dtype=h.dtype)
    grad_out[torch.arange(t), :, 0, torch.arange(t)] = v
    grad_out = grad_out.reshape(t * k, 1, t, d)
    try:
        (g,) = torch.autograd.grad(h, x, grad_out, retain_graph=True, is_grads_batched=True)
    except RuntimeError:  # an op without a batching rule: one backward per probe
        g = torch.stack([torch.autograd.grad(h, x, u, retain_graph=True)[0] for u in grad_out])
    g = g.reshape(t, k, t, x.shape[2])
    sq = g.pow(2).sum((1, 3))
    return (sq if probes is None else sq / k).sqrt()


def transport(model, ids: torch.Tensor, loops: int | None = None, probes: int | None = None
              ) -> tuple[list[App], list[dict]]:
    """Influence matrices around every mixer application for one sequence ``ids`` (1, T)."""
    apps, leaf = applications(model, loops), []
    with torch.enable_grad(), capture(model, leaf=leaf) as rec:
        model(ids, loops=loops)
        cache: dict[int, torch.Tensor] = {}

        def m_at(i: int) -> torch.Tensor:
            if i not in cache:
                cache[i] = _influence(rec.points[i], leaf[-1], probes).detach()
            return cache[i]

        rows = []
        for app in apps:
            if app.op != "mixer":
                continue
            m_in, m_out = m_at(app.index), m_at(app.index + 1)
            c_in, c_out = _off_diag(m_in), _off_diag(m_out)
            norm = c_out.norm().item()
            rows.append({"application": app.index, "label": app.label(), "layer": app.layer,
                         "iteration": app.iteration, "looped": app.looped,
                         "erank": effective_rank(c_out),
                         "cross_frac": norm / max(m_out.norm().item(), 1e-30),
                         "new": (c_out - c_in).norm().item() / norm if norm > 0 else 0.0,
                         "new_erank": effective_rank(c_out - c_in),
                         "C": c_out.tolist()})
    return apps, rows


def _off_diag(m: torch.Tensor) -> torch.Tensor:
    return m - torch.diag_embed(torch.diagonal(m))


@torch.no_grad()
def traces(model, batches, loops: int | None = None, gate_off: bool = False) -> list[dict]:
    """Residual RMS, max |h| and first-token attention mass along the unrolled depth,
    averaged over ``batches``; one row per point (each application's input, then the
    final norm's input)."""
    apps = applications(model, loops)
    labels = [a.label() for a in apps] + ["final"]
    acc = [{"point": i, "label": lab, "rms": 0.0, "max_abs": 0.0, "first_token_mass": None}
           for i, lab in enumerate(labels)]
    for x, _ in batches:
        with capture(model, attention=True, gate_off=gate_off) as rec:
            model(x, loops=loops)
            for row, h in zip(acc, rec.points):
                row["rms"] += h.float().pow(2).mean().sqrt().item() / len(batches)
                row["max_abs"] = max(row["max_abs"], h.float().abs().max().item())
            for i, probs in rec.attn.items():
                mass = torch.stack([p[:, :, 1:, 0].mean() for p in probs]).mean().item()
                prev = acc[i]["first_token_mass"] or 0.0
                acc[i]["first_token_mass"] = prev + mass / len(batches)
    return acc


__all__ = ["Evaluator", "effective_rank", "interventions", "kl", "transport", "traces", "truncation"]

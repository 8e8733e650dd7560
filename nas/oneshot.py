"""One-shot search (PostNAS, Jet-Nemotron): a space's supernet, its sub-networks, and the
search over placements.

A one-shot space's base is a hybrid (``num_layers`` + ``hybrid.ratio``). Its **supernet**
is the same model with every layer a ``switch`` over the ratio's mixers (random placement,
resampled every forward pass) and, with ``oneshot.loops``, elastic depth over those loop
counts. A **sub-network** fixes every switch to one option and the loop count to one
``k``: :func:`subnet` writes it as a plain canonical spec, whose parameters are a subset of
the supernet's (``runners.weights`` copies them). The search visits placements
with exactly the ratio's number of layers of each mixer: :func:`exhaustive` lists them
all, :func:`beam_search` keeps the best ``width`` and moves one layer at a time.

Every one-shot sweep then checks itself (``oneshot.check``, :class:`OneShotCheckSpec`):
:func:`spot_check` picks sub-networks spread over the one-shot ranking, the sweep trains
them stand-alone with seeds, and :func:`agreement` says whether the two rankings agree.
``oneshot.remedy`` (:class:`OneShotRemedySpec`) holds the known remedies for a one-shot
ranking that disagrees with stand-alone training (``runners.oneshot.remedies``).

Pure data and pure functions: no torch.
"""
from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Callable, Hashable, Iterable, Literal, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import Problem, SpecError
from .load import resolve, spec_from_dict
from .placement import placement, ratio_counts
from .proxy import MAX_SEEDS
from .spec import MAX_NAME, ArchSpec, HybridSpec, SwitchSpec

State = TypeVar("State", bound=Hashable)
RULES = ("interleave", "bookend", "front", "back")


def mixer_names(space) -> tuple[str, ...]:
    """The switch options, in the base hybrid's ratio order."""
    return tuple(space.base["hybrid"]["ratio"])


def counts(space) -> tuple[int, ...]:
    """Layers of each mixer in every searched placement: the base ratio over its layers."""
    c = ratio_counts(space.base["hybrid"]["ratio"], space.base["num_layers"])
    return tuple(c[n] for n in mixer_names(space))


def loop_choices(space) -> tuple[int | None, ...]:
    """The searched loop counts (``(None,)``: the base's own)."""
    return space.spec.oneshot.loops or (None,)


def supernet_data(space) -> dict[str, Any]:
    """The supernet as a user-level spec mapping (see the module docstring)."""
    data = copy.deepcopy(space.base)
    one = space.spec.oneshot
    hybrid = {**data["hybrid"], "placement": "random"}
    if one.sampling == "uniform":  # every layer on its own, each option equally likely
        hybrid.update(ratio={name: 1 for name in hybrid["ratio"]}, sampling="uniform")
    data["hybrid"] = hybrid
    if one.loops:
        n = len(one.loops)
        data["loop"] = {**data["loop"], "T": max(one.loops)}
        data["elastic"] = {"train": {"values": list(one.loops), "weights": [1.0 / n] * n},
                           "eval": list(one.loops), "switch_at": 0.0}
    data["name"] = fit_name(space.name, "_supernet")
    return data


def supernet(space) -> ArchSpec:
    """The canonical supernet spec of a one-shot space."""
    return resolve(spec_from_dict(supernet_data(space), "supernet"), "supernet")


def check_supernet(space) -> None:
    """A space whose supernet is not a valid spec fails at load, at the ``oneshot`` field;
    a remedy the space cannot use fails at its own field (:func:`remedy_problems`)."""
    try:
        net = supernet(space)
    except SpecError as exc:
        raise SpecError([Problem("oneshot", f"the supernet is not a valid spec: {p.render(None)}")
                         for p in exc.problems], str(space.source)) from None
    problems = remedy_problems(space.spec.oneshot, net)
    if problems:
        raise SpecError(problems, str(space.source))


def subnet(net: ArchSpec, pattern: Sequence[int], loops: int | None = None) -> ArchSpec:
    """The plain canonical spec of one sub-network: switch layer i runs option
    ``pattern[i]``, every loop region runs ``loops`` times (None: its own T); no random
    placement, no elastic depth. A loop schedule keeps its first ``loops`` iterations."""
    assert net.is_canonical and len(pattern) == net.L
    layers = tuple(l.model_copy(update={"mixer": l.mixer.options[p]}) if isinstance(l.mixer, SwitchSpec) else l
                   for l, p in zip(net.layers, pattern))
    regions = net.loops
    if loops is not None:
        regions = tuple(r.model_copy(update={"T": loops, "schedule": tuple(
            o for o in r.schedule if o.iteration < loops)}) for r in net.loops)
    names = "-".join(option_label(l.mixer, p) for l, p in zip(net.layers, pattern))
    data = net.model_dump(mode="json")
    data.update(name=fit_name(f"{net.name.removesuffix('_supernet')}_{names}", f"_T{loops}" if loops else "",
                              SUBNET_NAME),
                layers=[l.model_dump(mode="json") for l in layers],
                loops=[r.model_dump(mode="json") for r in regions], elastic=None, random_placement=None)
    return resolve(ArchSpec.model_validate(data), "subnet")


def layer_label(mixer) -> str:
    window = getattr(mixer, "window", None)
    return mixer.kind + (f"{window}" if window else "")


def option_label(layer_mixer, p: int) -> str:
    """The name piece of option ``p`` of a supernet layer's mixer (a switch, or the one
    mixer of a fixed layer): its :func:`layer_label`, with ``.p`` when another option of
    that switch has the same label (two attention variants, say), so sub-network names
    stay unique."""
    if not isinstance(layer_mixer, SwitchSpec):
        return layer_label(layer_mixer)
    labels = [layer_label(o) for o in layer_mixer.options]
    return labels[p] + (f".{p}" if labels.count(labels[p]) > 1 else "")


HASH = 12  # hex digits of sha256 in a shortened name: no collision among 10^6 names (p < 2e-3)
SUBNET_NAME = 128  # longest sub-network name: room for any suffix in a file name; readable in a table


def fit_name(stem: str, suffix: str = "", limit: int = MAX_NAME) -> str:
    """``stem + suffix`` when it has at most ``limit`` characters, else the first
    characters of ``stem``, ``-``, :data:`HASH` hex digits of the SHA-256 of the whole name
    and ``suffix``, ``limit`` characters in all: deterministic, as unique as the whole name,
    readable at the start and the end (the supernet's ``_supernet``, a sub-network's ``_T2``)."""
    name = stem + suffix
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH]
    return stem[:limit - len(suffix) - HASH - 1].rstrip("-_.+") + "-" + digest + suffix


def pattern_of(arch: ArchSpec, net: ArchSpec) -> list[int]:
    """The option each layer of sub-network ``arch`` takes in supernet ``net``."""
    out = []
    for i, (sub, layer) in enumerate(zip(arch.layers, net.layers)):
        if not isinstance(layer.mixer, SwitchSpec):
            out.append(0)
            continue
        match = [j for j, o in enumerate(layer.mixer.options) if o == sub.mixer]
        if not match:
            raise ValueError(f"layer {i}: mixer {sub.mixer.kind!r} is none of the supernet's options")
        out.append(match[0])
    return out


def candidate(space, trial) -> tuple[ArchSpec, dict[str, Any], dict[str, Any]]:
    """A one-shot space's candidate: a sub-network chosen by ``layer{i}`` (a mixer name)
    and ``T`` (a loop count, with ``oneshot.loops``) parameters."""
    names, L = mixer_names(space), space.base["num_layers"]
    params: dict[str, Any] = {f"layer{i}": trial.suggest_categorical(f"layer{i}", list(names)) for i in range(L)}
    loops = None
    if space.spec.oneshot.loops:
        loops = params["T"] = trial.suggest_categorical("T", list(space.spec.oneshot.loops))
    pattern = [names.index(params[f"layer{i}"]) for i in range(L)]
    return subnet(supernet(space), pattern, loops), {}, params


def trial_params(space, pattern: Sequence[int], loops: int | None) -> dict[str, Any]:
    """The parameters :func:`candidate` reads back as ``pattern`` at ``loops``."""
    names = mixer_names(space)
    params: dict[str, Any] = {f"layer{i}": names[p] for i, p in enumerate(pattern)}
    return params if loops is None else {**params, "T": loops}


def exhaustive(counts_: Sequence[int], limit: int = 1_000_000) -> list[tuple[int, ...]]:
    """Every placement with ``counts_[i]`` layers of option i, in lexicographic order."""
    L, total = sum(counts_), 1
    for i, c in enumerate(counts_):
        total *= math.comb(sum(counts_[i:]), c)
    if total > limit:
        raise ValueError(f"{total:,} placements of {L} layers: too many to list; use beam search")
    placements: list[list[int | None]] = [[None] * L]
    for option, c in enumerate(counts_):
        nxt = []
        for p in placements:
            for chosen in combinations([i for i, o in enumerate(p) if o is None], c):
                q = list(p)
                for i in chosen:
                    q[i] = option
                nxt.append(q)
        placements = nxt
    return sorted(tuple(p) for p in placements)


def rule_placements(names: Sequence[str], counts_: Sequence[int]) -> list[tuple[int, ...]]:
    """The rule-based placements (interleave, bookend, front, back) at these counts: the
    beam's starting points."""
    L = sum(counts_)
    ratio = {n: c for n, c in zip(names, counts_) if c}
    out = []
    for rule in RULES:
        hybrid = HybridSpec(ratio=ratio, placement=rule)
        p = tuple(names.index(n) for n in placement(hybrid, L))
        if p not in out:
            out.append(p)
    return out


def swaps(p: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Placements one move away: two layers with different mixers exchange them (the
    counts stay the same)."""
    out = set()
    for i in range(len(p)):
        for j in range(i + 1, len(p)):
            if p[i] != p[j]:
                q = list(p)
                q[i], q[j] = q[j], q[i]
                out.add(tuple(q))
    return sorted(out)


def beam_search(score: Callable[[State], float | None], start: Iterable[State],
                neighbours: Callable[[State], Iterable[State]], width: int, depth: int
                ) -> tuple[State, dict[State, float]]:
    """Local beam search (higher score is better; None: failed, ranked last): score the
    ``start`` states, keep the best ``width``; at each of at most ``depth`` steps score
    every unseen neighbour of the beam and keep the best ``width`` of beam and neighbours;
    stop early when no new state is seen or the beam stays the same. Returns the best
    state and every score, each state scored once."""
    seen: dict[State, float] = {}

    def rank(states: Iterable[State]) -> list[State]:
        for s in states:
            if s not in seen:
                value = score(s)
                seen[s] = -math.inf if value is None or math.isnan(value) else value
        return sorted(dict.fromkeys(states), key=lambda s: -seen[s])

    beam = rank(list(start))[:width]
    for _ in range(depth):
        pool = list(dict.fromkeys([*beam, *(n for s in beam for n in neighbours(s))]))
        if all(s in seen for s in pool):
            break
        nxt = rank(pool)[:width]
        if nxt == beam:
            break
        beam = nxt
    best = max(seen, key=lambda s: seen[s])
    return best, seen


class _Remedy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FinetuneSpec(_Remedy):
    """Inherit, then fine-tune: every candidate trains ``fraction`` of the stand-alone steps
    (the proxy's) from the supernet's weights, on the proxy's task, before it is scored."""

    fraction: float = Field(0.1, gt=0, le=1, allow_inf_nan=False,
                            description="of the proxy's (stand-alone) steps; at least one step")


class SandwichSpec(_Remedy):
    """BigNAS sandwich sampling: every supernet step trains the largest sub-network (the
    largest loop count, a sampled placement) on the labels, the smallest (the smallest loop
    count) and ``random`` sampled ones; with ``distill`` those learn from the largest's
    detached predictions (in-place distillation) instead of the labels."""

    distill: bool = True
    random: int = Field(1, ge=0, le=8, description="sampled sub-networks beside the largest and smallest")


class FewShotSpec(_Remedy):
    """Few-shot supernets: train one supernet ``warm`` of the steps, then split it on its
    first decision (``layer0``: layer 0's mixer) into one supernet per option, each from
    that shared warm start, trained the remaining steps with layer 0 fixed; a candidate is
    scored by its branch's supernet."""

    split: Literal["layer0"] = "layer0"
    warm: float = Field(0.5, ge=0, lt=1, allow_inf_nan=False, description="share of the steps before the split")


class OneShotRemedySpec(_Remedy):
    """``oneshot.remedy``: the remedies for a one-shot ranking that disagrees with stand-alone
    training, any together (``true`` for a remedy: its defaults). ``per_loop_gates``: the
    supernet holds a residual-gate table (ρ) per loop count, so a sub-network at T = 1 is
    trained and scored with its own gates, not the first row of those tuned for T = 3."""

    finetune: FinetuneSpec | None = None
    sandwich: SandwichSpec | None = None
    few_shot: FewShotSpec | None = None
    per_loop_gates: bool = False

    @field_validator("finetune", "sandwich", "few_shot", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """``true``: the remedy with its defaults; ``false``: off."""
        if value is True:
            return {}
        return None if value is False else value

    @property
    def trains_supernet(self) -> bool:
        """Whether the supernet trains in ``runners.oneshot.remedies`` (else the proxy trainer)."""
        return self.sandwich is not None or self.few_shot is not None or self.per_loop_gates

    def names(self) -> list[str]:
        """The remedies switched on, in field order."""
        return [k for k in type(self).model_fields if getattr(self, k) not in (None, False)]


def remedy_problems(one, net: ArchSpec) -> list[Problem]:
    """What a space's remedies need of it: sandwich sampling orders sub-networks by loop
    count, per-loop gates need a residual gate to split."""
    remedy, out = one.remedy, []
    if remedy.sandwich is not None and len(one.loops or ()) < 2:
        out.append(Problem("oneshot.remedy.sandwich", "sandwich sampling trains the largest and smallest "
                           "loop counts: give oneshot.loops two or more counts, or remove it"))
    if remedy.per_loop_gates:
        if len(one.loops or ()) < 2:
            out.append(Problem("oneshot.remedy.per_loop_gates", "gates per loop count need oneshot.loops "
                               "with two or more counts; remove per_loop_gates"))
        if not any(r.update.kind == "residual_gate" for r in net.loops):
            out.append(Problem("oneshot.remedy.per_loop_gates", "the base's loop has no residual gate to "
                               "split per loop count: give it loop.update: {kind: residual_gate}, or "
                               "remove per_loop_gates"))
    return out


AGREE_ALPHA = 0.01  # "agrees": τ > 0 and its one-sided permutation p below this
MAX_CHECK = 1024  # oneshot.check.n: sub-networks the self-check may train stand-alone


class OneShotCheckSpec(BaseModel):
    """``oneshot.check``: after the search, train ``n`` sub-networks spread over the one-shot
    ranking (:func:`spot_check`) stand-alone at the proxy's budget, ``seeds`` runs each (seeds
    ``search.seed + i``), and compare the two rankings (:func:`agreement`). ``check: false``
    skips it (the sweep says so); ``true`` is these defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(6, ge=3, le=MAX_CHECK, description="sub-networks to train stand-alone (the one-shot "
                   "front, the top and the bottom always among them, so more when the front is larger)")
    seeds: int = Field(3, ge=2, le=MAX_SEEDS, description="stand-alone runs of each, for the interval over seeds")


def check_settings(value: OneShotCheckSpec | bool) -> OneShotCheckSpec | None:
    """``oneshot.check`` as settings (None: skipped)."""
    if value is True:
        return OneShotCheckSpec()
    return value or None


def spot_check(ranked: Sequence[State], front: Iterable[State], n: int) -> list[State]:
    """The candidates a self-check trains, in ranking order: every member of the one-shot
    ``front``, the top and the bottom of the one-shot ranking (``ranked``, best first), then,
    until ``n`` are chosen, the candidate farthest in rank from every one chosen (nearer the
    top on a tie): so the sample spreads over the whole ranking."""
    front = set(front)
    picked = {i for i, c in enumerate(ranked) if c in front}
    picked |= {0, len(ranked) - 1} if ranked else set()
    while len(picked) < min(n, len(ranked)):
        free = [i for i in range(len(ranked)) if i not in picked]
        picked.add(max(free, key=lambda i: (min(abs(i - j) for j in picked), -i)))
    return [ranked[i] for i in sorted(picked)]


@dataclass(frozen=True)
class Agreement:
    """Kendall τ between one-shot scores and stand-alone means over ``n`` candidates with
    ``seeds`` stand-alone runs each: its 95% interval over seeds (``lo``, ``hi``), the exact
    one-sided permutation ``p`` of τ > 0 (n ≤ 8; Monte Carlo above), and the verdict."""

    tau: float
    lo: float
    hi: float
    p: float
    n: int
    seeds: int
    agrees: bool
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """The fields ``status --json`` shows as ``oneshot_check`` (NaN as None)."""
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None
        return {"tau": num(self.tau), "tau_ci": [num(self.lo), num(self.hi)], "p": num(self.p), "n": self.n,
                "seeds": self.seeds, "agrees": self.agrees, "verdict": self.verdict,
                "alternative": "one-sided: agreement means tau > 0", "alpha": AGREE_ALPHA}


def agreement(oneshot: Sequence[float], standalone: Sequence[Sequence[float]], draws: int = 2000,
              seed: int = 0) -> Agreement:
    """Whether a one-shot ranking agrees with stand-alone training: ``oneshot[i]`` is candidate
    i's one-shot score, ``standalone[i]`` its stand-alone value at each seed (the same metric,
    so τ > 0 is agreement whichever way it is better). It *agrees* when τ > 0 and the one-sided
    permutation p < :data:`AGREE_ALPHA`; the interval resamples the stand-alone seeds, jointly
    across candidates (``nas.noise.tau_ci``)."""
    import numpy as np

    from .noise import tau_ci

    n = len(oneshot)
    if len(standalone) != n:
        raise ValueError(f"{n} one-shot scores but {len(standalone)} stand-alone rows")
    seeds = len(standalone[0]) if n else 0
    if n < 2:
        return Agreement(math.nan, math.nan, math.nan, math.nan, n, seeds, False,
                         verdict(math.nan, math.nan, math.nan, math.nan, n, seeds, False))
    a = np.asarray(oneshot, dtype=float).reshape(n, 1)
    ci = tau_ci(a, np.asarray(standalone, dtype=float), draws=draws, seed=seed)
    agrees = bool(math.isfinite(ci.tau) and ci.tau > 0 and math.isfinite(ci.p) and ci.p < AGREE_ALPHA)
    return Agreement(ci.tau, ci.lo, ci.hi, ci.p, n, seeds, agrees, verdict(ci.tau, ci.lo, ci.hi, ci.p, n, seeds, agrees))


def verdict(tau: float, lo: float, hi: float, p: float, n: int, seeds: int, agrees: bool) -> str:
    """The self-check's sentence (see :func:`agreement`)."""
    if n < 2 or not math.isfinite(tau):
        return (f"cannot be checked: {n} spot-check candidate{'s' if n != 1 else ''} with a stand-alone "
                "result, and no two ranked apart; this front says where to look, not what is best")
    numbers = (f"τ = {tau:.2g}, one-sided p = {p:.2g}; 95% interval over seeds {lo:.2g} to {hi:.2g}; "
               f"{n} candidates × {seeds} seeds")
    if agrees:
        return f"the one-shot ranking agrees with stand-alone training on the spot-check ({numbers})"
    floor = 1 / math.factorial(n)
    cannot = (f"; with {n} candidates no ranking can reach p < {AGREE_ALPHA:g} (the exact floor is "
              f"{floor:.2g}): raise oneshot.check.n" if floor >= AGREE_ALPHA else "")
    return (f"the one-shot ranking does not agree with stand-alone training on the spot-check ({numbers}"
            f"{cannot}): this front says where to look, not what is best")


__all__ = ["mixer_names", "counts", "loop_choices", "supernet_data", "supernet", "check_supernet",
           "subnet", "pattern_of", "candidate", "trial_params", "exhaustive", "rule_placements",
           "swaps", "beam_search", "fit_name", "option_label", "HASH", "SUBNET_NAME", "AGREE_ALPHA", "MAX_CHECK",
           "OneShotCheckSpec", "check_settings", "OneShotRemedySpec", "FinetuneSpec",
           "SandwichSpec", "FewShotSpec", "remedy_problems", "spot_check", "Agreement", "agreement", "verdict"]

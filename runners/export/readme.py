"""The README of an export directory: what the model is, how it was chosen, how to load it."""
from __future__ import annotations

from nas.cost import CostSheet
from nas.graph import describe
from nas.plan import applications
from nas.spec import ArchSpec, OpAddr
from nas.units import si


def _layers(arch: ArchSpec, loops: int | None) -> str:
    runs = applications(arch, loops)
    rows = ["| layer | mixer | ffn | mixer runs | ffn runs |", "| --- | --- | --- | --- | --- |"]
    for i, layer in enumerate(arch.layers):
        rows.append(f"| {i} | {describe(layer.mixer)} | {describe(layer.ffn)} | "
                    f"{runs[OpAddr(layer=i, op='mixer')]} | {runs[OpAddr(layer=i, op='ffn')]} |")
    return "\n".join(rows)


def _loops(arch: ArchSpec, loops: int | None) -> str:
    if not arch.loops:
        return "No loop regions: every layer runs once."
    lines = []
    for j, r in enumerate(arch.loops):
        extra = f", conditioning {r.conditioning}" if r.conditioning != "none" else ""
        sched = f", {len(r.schedule)} schedule overrides" if r.schedule else ""
        lines.append(f"- region {j}: {r.start} .. {r.end}, T = {r.T}, update {r.update.kind}{extra}{sched}")
    if arch.elastic is not None:
        lines.append(f"- elastic depth: trained at loop counts {list(arch.elastic.train.values)}, "
                     f"evaluated at {list(arch.elastic.eval)}")
    if loops is not None:
        lines.append(f"- this export runs every region at **k = {loops}** loops by default (`config.loops`; "
                     "the runs above are at this k); pass `loops=k` to `forward` or `generate` for another depth")
    return "\n".join(lines)


def _generation(arch: ArchSpec) -> str:
    lines = ["With `use_cache=True` (the default) `generate()` runs the prompt once and then one step "
             "per new token, keeping the attention KV and recurrent state of every mixer application "
             "in a `LoopnasCache`. Keyword arguments, fixed for the session:", "",
             "- `loops=k`: the loop count (default `config.loops`);"]
    if arch.kv_policy == "last_loop":
        lines.append("- `kv_policy`: this spec's is `last_loop` (one KV cache per attention layer, written by "
                     "the loop's last iteration and read by all), which differs slightly from the uncached "
                     "forward; `per_loop` (a KV cache per iteration) matches it exactly;")
    else:
        lines.append("- `kv_policy`: `per_loop` (this spec's: greedy tokens equal the uncached ones) or "
                     "`last_loop` (one KV cache per attention layer, shared by a loop's iterations);")
    if arch.random_placement is not None:
        lines.append("- `pattern=[...]`: the option of every switch layer, sampled once per call when absent "
                     "(the uncached forward instead votes over several sampled patterns);")
    lines += ["", "Beam search and assisted decoding are not supported (recurrent states cannot be "
              "reordered or rolled back). Decoding runs on the pure-torch layers, on the same "
              "parameters, even where `backend` picks fla's kernels for the forward pass."]
    return "\n".join(lines)


def readme(arch: ArchSpec, sheet: CostSheet, *, loops: int | None, how: str, with_weights: bool,
           extra: str = "") -> str:
    weights = ("`model.safetensors` holds proxy-trained weights (a small proxy task: useful to check "
               "the export, not as a language model)." if with_weights else
               "No weights: `from_config` builds the model with loopnas's own initialisation.")
    load = ('model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)' if with_weights else
            'config = AutoConfig.from_pretrained("PATH", trust_remote_code=True)\n'
            'model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)')
    fig = sheet.figures if loops is None or not sheet.per_k else sheet.at(loops)
    desc = f"\n\n{arch.description}" if arch.description else ""
    return f"""# {arch.name}

A loopnas architecture exported for Hugging Face `transformers`: {len(arch.layers)} physical layers,
width {arch.model.width}, vocabulary {arch.model.vocab_size}, {sheet.unique_params:,} unique parameters.{desc}

## How it was chosen

{how}

## Structure

{_layers(arch, loops)}

{_loops(arch, loops)}

Projection compute {si(fig.projection.total)} FLOPs/token, forward {si(fig.forward_flops)} FLOPs/token
at context {sheet.seq_len}; the full cost sheet is `cost.json`, the canonical spec `spec.yaml`.

## Loading

```python
from transformers import AutoConfig, AutoModelForCausalLM
{load}
out = model(input_ids, labels=input_ids)   # labels unshifted: the model shifts them
out.loss, out.logits
```

{weights} {extra}

Needs `torch`, `transformers` and `pydantic` (the spec classes); `flash-linear-attention`'s
kernels are used on CUDA when installed (`backend` in `config.json`: `auto`, `torch`, `fla`).
loopnas itself is not needed: its modules are copied here (`loopnas_vendored.py` lists them).

For trainers: the physical layers are `model.model.layers` (a looped model applies some of
them several times per forward pass); a model built on the meta device and then initialised
gets loopnas's init, loop gates included. Padding masks are not supported.

## Generation

```python
out = model.generate(input_ids, max_new_tokens=32, do_sample=False)             # cached
out = model.generate(input_ids, max_new_tokens=32, do_sample=True, top_k=50)
out = model.generate(input_ids, max_new_tokens=32, use_cache=False)             # reruns the prefix
```

{_generation(arch)}
"""


__all__ = ["readme"]

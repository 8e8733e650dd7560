"""The README of a native export: which transformers class it is, how to load it."""
from __future__ import annotations

from nas.cost import CostSheet
from nas.spec import ArchSpec
from nas.units import si

from ..readme import _layers


def native_readme(arch: ArchSpec, sheet: CostSheet, *, family: str, architecture: str, how: str,
                  with_weights: bool, extra: str = "") -> str:
    weights = ("`model.safetensors` holds the proxy-trained weights, converted to this family's layout "
               "(a small proxy task: useful to check the export, not as a language model)." if with_weights else
               "No weights: `from_config` builds the model with transformers' initialisation of this family.")
    load = ('model = AutoModelForCausalLM.from_pretrained("PATH")' if with_weights else
            'model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("PATH"))')
    desc = f"\n\n{arch.description}" if arch.description else ""
    fig = sheet.figures
    return f"""# {arch.name}

A loopnas architecture exported as a native `transformers` model: `model_type: {family}`
(`{architecture}`), {len(arch.layers)} layers, width {arch.model.width}, vocabulary
{arch.model.vocab_size}, {sheet.unique_params:,} parameters (the same count in loopnas and in
transformers' model).{desc}

## How it was chosen

{how}

## Structure

{_layers(arch, None)}

No loop regions: every layer runs once, as the family does.

Projection compute {si(fig.projection.total)} FLOPs/token, forward {si(fig.forward_flops)} FLOPs/token
at context {sheet.seq_len}; the full cost sheet is `cost.json`, the loopnas spec `spec.yaml`
(`loopnas import config.json` gives it back).

## Loading

No remote code: this is transformers' own implementation of `{family}`.

```python
from transformers import AutoConfig, AutoModelForCausalLM
{load}
out = model(input_ids, labels=input_ids)   # labels unshifted: the model shifts them
```

{weights} {extra}

Every trainer and serving engine that supports `{family}` accepts this directory as it is.
"""


__all__ = ["native_readme"]

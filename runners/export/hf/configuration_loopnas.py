"""The transformers config of a loopnas export: the canonical architecture spec, as data.

Written by ``loopnas export``; loads without loopnas (imports transformers only).
"""
from transformers import PretrainedConfig


class LoopnasConfig(PretrainedConfig):
    """``arch``: the canonical loopnas spec (``ArchSpec.model_dump(mode="json")``): every
    layer and loop region explicit. ``loops``: the loop count every region runs by default
    (None: each region's own ``T``; an elastic model's chosen depth otherwise).
    ``backend``: ``auto`` (fla's Triton kernels where CUDA and fla are available, else pure
    torch), ``torch`` or ``fla`` (incremental decoding always runs the torch layers, on the
    same parameters). ``use_cache``: whether ``generate`` decodes incrementally by default.
    ``vocab_size``, ``hidden_size`` and ``num_hidden_layers`` mirror the spec for tools
    that read them."""

    model_type = "loopnas"
    base_model_fsdp_plan = {"embed": "free_full_weight", "layers.*": "free_full_weight",
                            "norm": "keep_full_weight"}

    def __init__(self, arch: dict | None = None, loops: int | None = None, backend: str = "auto",
                 **kwargs):
        self.arch = arch or {}
        self.loops = loops
        self.backend = backend
        model = self.arch.get("model", {})
        self.vocab_size = model.get("vocab_size")
        self.hidden_size = model.get("width")
        self.num_hidden_layers = len(self.arch.get("layers") or ())
        kwargs.setdefault("tie_word_embeddings", model.get("tie_embeddings", True))
        kwargs.setdefault("use_cache", True)  # generate() prefills once, then decodes token by token
        super().__init__(**kwargs)

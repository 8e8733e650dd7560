"""A loopnas architecture as a transformers causal LM.

Written by ``loopnas export`` next to flat copies of the loopnas modules that build the
model (``builders_*.py``, ``nas_*.py``, listed in ``loopnas_vendored.py``), so it loads
with ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`` where loopnas
is not installed. Needs torch, transformers and pydantic; fla (flash-linear-attention)
is used on CUDA when installed.

Conventions for trainers: ``forward(input_ids, labels)`` takes *unshifted* labels (the
model shifts them; -100 is ignored) and returns ``.loss`` and ``.logits``; the physical
layers are ``model.model.layers`` (a ``ModuleList``; a looped model applies some of them
several times per forward); a model built on the meta device and then initialised
(``to_empty`` + ``init_weights``) gets loopnas's own initialisation.
"""
import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .builders_model import Block, LoopLM, resolve_backend
from .configuration_loopnas import LoopnasConfig
from .loopnas_vendored import SOURCES  # noqa: F401  (makes transformers copy every vendored file)
from .nas_spec import ArchSpec


class LoopnasPreTrainedModel(PreTrainedModel):
    config_class = LoopnasConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = False

    def _reference(self) -> LoopLM:
        """A freshly initialised loopnas model on the CPU in float32: its values are the init."""
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            with torch.device("cpu"):
                return LoopLM(self.model.arch, self.model.backend)
        finally:
            torch.set_default_dtype(dtype)

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """loopnas's initialisation for every tensor not loaded from a checkpoint.

        loopnas initialises in its constructors (A_log, dt_bias, convs, norms) and then in
        ``LoopLM.reset_parameters`` (linears, embeddings, loop gates); a reference model
        built once on the CPU supplies those values (one extra float32 copy while it runs),
        so the exported model never re-implements the init. Under ``torch.manual_seed(s)`` a
        meta-built model initialised this way equals ``LoopLM`` built directly under ``s``.
        """
        named = dict(self.named_parameters()) | dict(self.named_buffers())
        todo = {n: t for n, t in named.items() if not getattr(t, "_is_hf_initialized", False)}
        if not todo or any(t.is_meta for t in todo.values()):
            return
        ref = self._reference()
        values = dict(ref.named_parameters()) | dict(ref.named_buffers())
        prefix = f"{self.base_model_prefix}."
        for name, tensor in todo.items():
            tensor.copy_(values[name.removeprefix(prefix)])
            tensor._is_hf_initialized = True


class LoopnasForCausalLM(LoopnasPreTrainedModel, GenerationMixin):
    """``model``: the loopnas ``LoopLM``; ``model.layers``: its physical layers."""

    def __init__(self, config: LoopnasConfig):
        super().__init__(config)
        arch = ArchSpec.model_validate(config.arch)
        backend = resolve_backend(config.backend, "cuda" if torch.cuda.is_available() else None)
        self.model = LoopLM(arch, backend)
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            if not tensor.is_meta:  # built on a real device: the constructor already initialised it
                tensor._is_hf_initialized = True
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self):
        return getattr(self.model, "lm_head", None)  # tied models read embed.weight directly

    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None, loops: int | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutput:
        """``labels`` as transformers passes them: aligned with ``input_ids`` (the model
        shifts). ``loops``: run every loop region ``loops`` times (elastic depth).
        The loss includes loopnas's auxiliary losses (MoE load balance), as in training."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("loopnas models take no padding mask: pass unpadded sequences "
                             "(or equal-length batches)")
        shifted = None
        if labels is not None:
            shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        out = self.model(input_ids, labels=shifted, loops=loops if loops is not None else self.config.loops)
        return CausalLMOutput(loss=out.loss, logits=out.logits)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs) -> dict:
        """No inference cache yet: every step reruns the whole sequence."""
        return {"input_ids": input_ids, "loops": kwargs.get("loops")}


__all__ = ["LoopnasConfig", "LoopnasPreTrainedModel", "LoopnasForCausalLM", "Block"]

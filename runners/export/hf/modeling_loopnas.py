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
``gradient_checkpointing_enable()`` (``Trainer(gradient_checkpointing=True)``) turns on
loopnas's own activation checkpointing (``LoopLM.set_activation_checkpointing``): every
sublayer application, each loop iteration included, is recomputed in the backward; loss
and gradients are those of the plain run. It must be non-reentrant (the default).

Generation: ``generate(..., use_cache=True)`` (the default) runs loopnas's incremental
decoding, ``LoopLM.prefill`` once on the prompt and ``LoopLM.decode`` once per new token,
holding the session in a :class:`LoopnasCache`; ``use_cache=False`` reruns the whole
sequence each step. Both give the same greedy tokens, except that a spec with
``kv_policy: last_loop`` (ELR) decodes under that policy, which differs slightly from the
whole-sequence forward (pass ``kv_policy="per_loop"`` to match it), and a random-placement
model decodes one sampled pattern for the whole session, where the uncached forward votes
over several (pass ``pattern=[...]`` to fix one for both).
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .builders_inference import InferenceCache
from .builders_model import Block, LoopLM, resolve_backend
from .configuration_loopnas import LoopnasConfig
from .loopnas_vendored import SOURCES  # noqa: F401  (makes transformers copy every vendored file)
from .nas_spec import ArchSpec


class LoopnasCache(Cache):
    """One loopnas decoding session as a transformers ``Cache``: ``inference``, loopnas's
    :class:`InferenceCache` (every mixer application's KV or recurrent state, the loop
    count, switch pattern and KV policy of the session), and ``decoder``, the model that
    fills it (see :meth:`LoopnasForCausalLM._decoder`).

    Only what ``generate`` asks of a cache is supported: its length (so a returned cache
    continues with a longer prompt), no compilation, no cropping (recurrent states cannot
    roll back: no assisted decoding), no beam reordering or batch expansion.
    """

    def __init__(self, inference: InferenceCache, decoder: LoopLM):
        super().__init__(layers=[])
        self.inference, self.decoder = inference, decoder

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.inference.pos

    @property
    def is_linear(self) -> list[bool]:
        return [False]  # a length-tracking cache: generate slices a continued prompt by its length

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    def nbytes(self) -> dict[str, int]:
        """Bytes held: ``{"kv": ..., "state": ...}``."""
        return self.inference.nbytes()

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("a loopnas cache cannot be cropped, reordered or re-batched: "
                                  "use greedy or sampled decoding with one sequence per prompt")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = reset = _unsupported


class LoopnasPreTrainedModel(PreTrainedModel):
    config_class = LoopnasConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True  # LoopLM carries transformers' flag names

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

    _is_stateful = True  # recurrent states cannot roll back: no assisted decoding

    def __init__(self, config: LoopnasConfig):
        super().__init__(config)
        arch = ArchSpec.model_validate(config.arch)
        backend = resolve_backend(config.backend, "cuda" if torch.cuda.is_available() else None)
        self.model = LoopLM(arch, backend)
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            if not tensor.is_meta:  # built on a real device: the constructor already initialised it
                tensor._is_hf_initialized = True
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # forward makes its own LoopnasCache at prefill

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self):
        return getattr(self.model, "lm_head", None)  # tied models read embed.weight directly

    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None, loops: int | None = None,
                pattern: list[int] | None = None, kv_policy: str | None = None,
                cache: LoopnasCache | None = None, use_cache: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """``labels`` as transformers passes them: aligned with ``input_ids`` (the model
        shifts). ``loops``: run every loop region ``loops`` times (elastic depth; default
        ``config.loops``). The loss includes loopnas's auxiliary losses (MoE load balance),
        as in training.

        Incremental decoding (what ``generate`` drives): ``use_cache=True`` without a
        ``cache`` prefills ``input_ids`` and returns the session in ``.cache``; with a
        ``cache``, ``input_ids`` are the tokens after those it has seen. ``kv_policy``
        (``per_loop`` / ``last_loop``; default the spec's) and ``pattern`` are fixed at
        prefill. ``pattern``: the option of every switch layer of a random-placement model;
        without a cache it replaces the evaluation-time vote over sampled patterns.
        """
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("loopnas models take no padding mask: pass unpadded sequences "
                             "(or equal-length batches)")
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)
        loops = loops if loops is not None else self.config.loops
        shifted = None
        if labels is not None:
            shifted = F.pad(labels[:, 1:], (0, 1), value=-100)
        if cache is not None or (use_cache and not self.training):
            logits, cache = self._incremental(input_ids, cache, loops, pattern, kv_policy)
            loss = None if shifted is None else _cross_entropy(logits, shifted)
            return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
        if pattern is not None:
            if self.model.arch.random_placement is None:
                raise ValueError("pattern is for random-placement (switch) models; this model has none")
            h, aux = self.model.hidden(input_ids, loops, list(pattern))
            logits = self.model.head(h)
            loss = None if shifted is None else _cross_entropy(logits, shifted) + sum(aux)
            return CausalLMOutputWithPast(loss=loss, logits=logits)
        out = self.model(input_ids, labels=shifted, loops=loops)
        return CausalLMOutputWithPast(loss=out.loss, logits=out.logits)

    def _incremental(self, input_ids, cache, loops, pattern, kv_policy) -> tuple[torch.Tensor, LoopnasCache]:
        """Prefill a new session (``cache`` None) or decode the next tokens of one."""
        if cache is None:
            decoder = self._decoder()
            logits, session = decoder.prefill(input_ids, loops, None if pattern is None else list(pattern),
                                              kv_policy)
            return logits, LoopnasCache(session, decoder)
        if not isinstance(cache, LoopnasCache):
            raise TypeError(f"loopnas models decode with the LoopnasCache their prefill returns, "
                            f"not {type(cache).__name__}")
        if loops != cache.inference.loops:
            raise ValueError(f"this cache was prefilled at loops={cache.inference.loops}, not {loops}")
        return cache.decoder.decode(cache.inference, input_ids), cache

    def _decoder(self) -> LoopLM:
        """The model that decodes: ``self.model``, or, where it was built with fla's layers
        (``backend`` auto on CUDA), whose kernels keep no cache, a torch-backend twin that
        holds the very same parameter tensors (parameter names are shared by design), made
        afresh at each prefill so it follows any move or cast of the model."""
        if self.model.backend == "torch":
            return self.model
        with torch.device("meta"):
            twin = LoopLM(self.model.arch, "torch")
        twin.load_state_dict(self.model.state_dict(), assign=True)
        return twin.train(self.model.training)


def _cross_entropy(logits: torch.Tensor, shifted: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), shifted.flatten(), ignore_index=-100)


__all__ = ["LoopnasCache", "LoopnasConfig", "LoopnasPreTrainedModel", "LoopnasForCausalLM", "Block"]

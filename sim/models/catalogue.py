"""The model catalogue: the named models ``get_model`` finds (by name, display name or
Hugging Face name), and ``model_from_mapping`` for an inline definition (optionally
``base:`` a catalogue entry)."""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Mapping

from sim.models.spec import _SEPARATE_CHARS, ModelSpec, UnknownModelError, resolve_dtype

_MB = "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
_NEMOTRON_H = dict(mamba_kind="mamba2", mamba_head_dim=64, n_groups=8, conv_kernel=4, head_dim=128,
                   vocab=131072, ffn_gated=False, chunk_size=128, passes_num_spec=True,
                   default_ssm_dtype="float32", vllm_architecture="NemotronHForCausalLM")
_NEMOTRON_H_NOTE = ("vLLM NemotronH rule: mamba_ssm_cache_dtype=auto -> HF config's "
                    "mamba_ssm_cache_dtype, else float32 (NemotronHForCausalLMConfig)")


def _nemotron_entries() -> list[ModelSpec]:
    """NVIDIA's hybrids: Nemotron-H, Nemotron Nano 2, Nemotron 3."""
    return [
        ModelSpec(
            name="nemotron-h-8b", display_name="Nemotron-H-8B-Base-8K",
            source=f"models.md §2 row Nemotron-H-8B-Base-8K: [S] {_MB} (NemotronHModelProvider8B) "
                   "+ HF config excerpt nvidia/Nemotron-H-8B-Base-8K; chunk_size 128 [M]",
            hidden=4096, num_layers=52, num_mamba_layers=24, num_attention_layers=4, num_mlp_layers=24,
            pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
            mamba_heads=128, d_state=128, q_heads=32, kv_heads=8, ffn_dim=21504,
            hf_names=("nvidia/Nemotron-H-8B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-h-47b", display_name="Nemotron-H-47B-Base-8K",
            source=f"models.md §2 row Nemotron-H-47B-Base-8K: [S] {_MB} (NemotronHModelProvider47B, "
                   "pattern); chunk_size 128 [M]",
            hidden=8192, num_layers=98, num_mamba_layers=45, num_attention_layers=5, num_mlp_layers=48,
            pattern=("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM"
                     "---M-M*-M-M-M-M-M-"),
            mamba_heads=256, d_state=256, q_heads=64, kv_heads=8, ffn_dim=30720,
            hf_names=("nvidia/Nemotron-H-47B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-h-56b", display_name="Nemotron-H-56B-Base-8K",
            source=f"models.md §2 row Nemotron-H-56B-Base-8K: [S] {_MB} (NemotronHModelProvider56B); "
                   "NVIDIA blog research.nvidia.com/labs/adlr/nemotronh '54 Mamba-2, 54 MLP, 10 attention'; "
                   "chunk_size 128 [S]",
            hidden=8192, num_layers=118, num_mamba_layers=54, num_attention_layers=10, num_mlp_layers=54,
            pattern=("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                     "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
            mamba_heads=256, d_state=256, q_heads=64, kv_heads=8, ffn_dim=32768,
            hf_names=("nvidia/Nemotron-H-56B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-nano-9b-v2", display_name="NVIDIA-Nemotron-Nano-9B-v2",
            source=f"models.md §2 row NVIDIA-Nemotron-Nano-9B-v2: [S] {_MB} (NemotronNanoModelProvider9Bv2) "
                   "+ HF config excerpt nvidia/NVIDIA-Nemotron-Nano-9B-v2 (mamba_ssm_cache_dtype float32); "
                   "chunk_size 128 [M]",
            hidden=4480, num_layers=56, num_mamba_layers=27, num_attention_layers=4, num_mlp_layers=25,
            pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
            mamba_heads=128, d_state=128, q_heads=40, kv_heads=8, ffn_dim=15680,
            **{**_NEMOTRON_H, "mamba_head_dim": 80},
            hf_names=("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "Nemotron-Nano-9B-v2"),
            notes=_NEMOTRON_H_NOTE),
        ModelSpec(
            name="nemotron-3-nano-30b", display_name="NVIDIA-Nemotron-3-Nano-30B-A3B",
            source=f"models.md §2 row Nemotron-3-Nano-30B-A3B: [S] {_MB} (Nemotron3NanoProvider: 128 experts "
                   "top-6, expert ffn 1856, shared expert 3712); chunk_size 128 [M]",
            hidden=2688, num_layers=52, num_mamba_layers=23, num_attention_layers=6, num_moe_layers=23,
            pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            mamba_heads=64, d_state=128, q_heads=32, kv_heads=2,
            num_experts=128, top_k=6, expert_ffn=1856, shared_experts=1, shared_expert_ffn=3712,
            hf_names=("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-3-Nano-30B-A3B",
                      "Nemotron-3-Nano-30B-A3B"),
            notes=_NEMOTRON_H_NOTE + "; no MTP weights [M]", **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-3-super-120b", display_name="NVIDIA-Nemotron-3-Super-120B-A12B",
            source=f"models.md §2 row Nemotron-3-Super-120B-A12B and §5: [S] {_MB} (Nemotron3SuperProvider: "
                   "512 experts top-22, expert ffn 2688, shared 5376, latent MoE 1024, MTP pattern '*E'); "
                   "MTP as built by vLLM 0.33.0 vllm/model_executor/models/nemotron_h_mtp.py; chunk_size 128 [M]",
            hidden=4096, num_layers=88, num_mamba_layers=40, num_attention_layers=8, num_moe_layers=40,
            pattern=("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*"
                     "EMEMEMEME"),
            mamba_heads=128, d_state=128, q_heads=32, kv_heads=2,
            num_experts=512, top_k=22, expert_ffn=2688, shared_experts=1, shared_expert_ffn=5376,
            moe_latent_dim=1024, mtp_layers=2, mtp_pattern="*E",
            hf_names=("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "NVIDIA-Nemotron-3-Super-120B-A12B",
                      "Nemotron-3-Super-120B-A12B"),
            notes=(_NEMOTRON_H_NOTE + "; MTP module = 2 layers '*E' (attention + MoE): with MTP spec decode "
                   "it adds 1 KV-cache attention layer (models.md §3 says '+2 MTP attn'; vLLM 0.33.0 builds "
                   "one '*' layer: num_nextn_predict_layers == 1 is asserted)"),
            **_NEMOTRON_H),
    ]


def _other_entries() -> list[ModelSpec]:
    """Qwen3-Next (Gated DeltaNet), Granite-4.0-H, Jamba (Mamba1)."""
    return [
        ModelSpec(
            name="qwen3-next-80b-a3b", display_name="Qwen3-Next-80B-A3B",
            source=("models.md §2 row Qwen3-Next-80B-A3B: [S] HF config excerpt Qwen/Qwen3-Next-80B-A3B-Instruct "
                    "(full_attention_interval 4, head_dim 256, linear_* fields); head counts and MoE dims "
                    "(512 experts top-10, expert ffn 512, 1 shared expert 512) [M]; MTP: §5 qwen3_next_mtp.py "
                    "(1 layer)"),
            hidden=2048, num_layers=48, num_mamba_layers=36, num_attention_layers=12, num_moe_layers=48,
            pattern="MMM*" * 12,
            mamba_kind="gdn", gdn_k_heads=16, gdn_v_heads=32, gdn_k_dim=128, gdn_v_dim=128, conv_kernel=4,
            supports_all_mode=False,
            q_heads=16, kv_heads=2, head_dim=256, attn_output_gate=True, vocab=151936,
            num_experts=512, top_k=10, expert_ffn=512, shared_experts=1, shared_expert_ffn=512,
            mtp_layers=1, mtp_pattern="*", passes_num_spec=True, default_ssm_dtype=None,
            # vLLM 0.33.0 Qwen3NextForCausalLM declares SupportsEagle3 only
            vllm_architecture="Qwen3NextForCausalLM", eagle_methods=("eagle3",),
            hf_names=("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking",
                      "Qwen3-Next-80B-A3B"),
            notes="mamba_cache_mode 'all' is rejected by vLLM ('please use --mamba-cache-mode=align')"),
        ModelSpec(
            name="granite-4.0-h-small", display_name="Granite-4.0-H-Small (32B-A9B)",
            source=("models.md §2 row Granite-4.0-H-Small: [S] HF config excerpt ibm-granite/granite-4.0-h-small "
                    "(layer_types 36 mamba / 4 attention, 72 experts top-10); mamba heads 128 and n_groups 1 [M]; "
                    "chunk_size 256 [M]; expert ffn 768 / shared 1536 / tied embeddings [M] (third-party copy "
                    "of the HF config)"),
            hidden=4096, num_layers=40, num_mamba_layers=36, num_attention_layers=4, num_moe_layers=40,
            mamba_kind="mamba2", mamba_heads=128, mamba_head_dim=64, d_state=128, n_groups=1, conv_kernel=4,
            chunk_size=256, q_heads=32, kv_heads=8, head_dim=128, vocab=100352, tie_embeddings=True,
            num_experts=72, top_k=10, expert_ffn=768, shared_experts=1, shared_expert_ffn=1536,
            # vLLM 0.33.0 granitemoehybrid.py passes num_spec=vllm_config.num_speculative_tokens into
            # mamba2_state_shape (models.md §1 says Granite does not; that was an older vLLM).
            passes_num_spec=True, default_ssm_dtype=None,
            # vLLM 0.33.0 GraniteMoeHybridForCausalLM declares neither SupportsEagle nor SupportsEagle3
            vllm_architecture="GraniteMoeHybridForCausalLM", eagle_methods=(),
            hf_names=("ibm-granite/granite-4.0-h-small",),
            notes="conv state grows with num_speculative_tokens in vLLM 0.33.0 (granitemoehybrid.py)"),
        ModelSpec(
            name="jamba-1.5-mini", display_name="Jamba-1.5-Mini (= Jamba-v0.1 shape)",
            source=("models.md §2 row Jamba-v0.1 / Jamba-1.5-Mini: [S] HF config excerpt ai21labs/Jamba-v0.1 "
                    "(attention offset 4 period 8, Mamba1 d_inner 8192, d_state 16, conv 4); MoE 16 experts "
                    "top-2, ffn 14336 every 2nd layer [M]"),
            hidden=4096, num_layers=32, num_mamba_layers=28, num_attention_layers=4,
            num_mlp_layers=16, num_moe_layers=16, pattern="MMMM*MMM" * 4,
            mamba_kind="mamba1", d_inner=8192, d_state=16, conv_kernel=4, dt_rank=256,
            supports_all_mode=False,
            q_heads=32, kv_heads=8, head_dim=128, vocab=65536,
            ffn_dim=14336, num_experts=16, top_k=2, expert_ffn=14336,
            passes_num_spec=False, default_ssm_dtype=None,
            # vLLM 0.33.0 JambaForCausalLM declares neither SupportsEagle nor SupportsEagle3
            vllm_architecture="JambaForCausalLM", eagle_methods=(),
            hf_names=("ai21labs/AI21-Jamba-1.5-Mini", "AI21-Jamba-1.5-Mini", "ai21labs/Jamba-v0.1",
                      "jamba-v0.1"),
            notes="Mamba1: conv state never includes speculative rows; no 'all' mode"),
    ]


CATALOGUE: dict[str, ModelSpec] = {m.name: m
                                   for m in _nemotron_entries() + _other_entries()}


def _norm(name: str) -> str:
    return name.strip().lower()


def _lookup_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for m in CATALOGUE.values():
        for alias in (m.name, m.display_name, *m.hf_names):
            a = _norm(alias)
            table[a] = m.name
            table[a.split("/", 1)[-1]] = m.name  # without the org prefix
    return table


_LOOKUP = _lookup_table()


def model_names() -> list[str]:
    return list(CATALOGUE)


def get_model(name: str) -> ModelSpec:
    """Catalogue entry by name, case-insensitively; HF-style names (``org/Repo``) work too."""
    key = _norm(str(name))
    hit = _LOOKUP.get(key) or _LOOKUP.get(key.split("/", 1)[-1])
    if hit is None:
        raise UnknownModelError(f"unknown model {name!r}; valid names: {', '.join(CATALOGUE)}")
    return CATALOGUE[hit]


_FIELD_TYPES = {f.name: f.type for f in fields(ModelSpec)}
_DERIVED_ONLY = {"params_estimated"}


def model_from_mapping(d: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from a mapping (inline YAML/JSON definition).

    Keys are the ``ModelSpec`` field names.  Extras:

    * ``base: NAME`` starts from a catalogue entry and overrides only the keys given.
    * ``pattern`` alone fills the four layer counts and ``num_layers`` (NemotronH characters).
    * ``dtype`` accepts the short names (bf16, fp16, fp32).

    Raises ``ValueError`` naming the field on unknown keys, missing fields and bad values.
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"model: expected a mapping, got {type(d).__name__}")
    data = dict(d)
    base_name = data.pop("base", None)
    for key in data:
        if key not in _FIELD_TYPES or key in _DERIVED_ONLY:
            raise ValueError(f"{key}: unknown model field")
    kw: dict[str, Any] = {}
    if base_name is not None:
        try:
            base = get_model(base_name)
        except UnknownModelError as e:
            raise ValueError(f"base: {e}") from None
        kw = {f.name: getattr(base, f.name) for f in fields(ModelSpec) if f.name not in _DERIVED_ONLY}
        # estimates follow the new shapes unless counts are given again
        for k in ("total_params", "active_params", "mtp_params", "display_name", "hf_names"):
            kw.pop(k)
        if "name" not in data:
            raise ValueError("name: required when overriding a base model")
        kw["source"] = f"inline definition based on {base.name} ({base.source})"
    for key, value in data.items():
        if key in ("hf_names", "eagle_methods"):
            if isinstance(value, str):
                value = (value,)
            elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
                value = tuple(value)
            else:
                raise ValueError(f"{key}: must be a list of strings, got {value!r}")
        elif key in ("dtype", "default_ssm_dtype") and isinstance(value, str):
            value = resolve_dtype(value, what=key)
        elif key == "pattern" and value is not None and not isinstance(value, str):
            raise ValueError(f"pattern: must be a string, got {value!r}")
        kw[key] = value
    pattern = data.get("pattern")
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(_SEPARATE_CHARS))
        if bad:
            raise ValueError(f"pattern: unknown characters {''.join(bad)!r} (use M * - E)")
        derived = {"num_layers": len(pattern), "num_mamba_layers": pattern.count("M"),
                   "num_attention_layers": pattern.count("*")}
        if set(pattern) & {"-", "E"}:  # NemotronH style: FFN blocks are pattern positions
            derived.update(num_mlp_layers=pattern.count("-"), num_moe_layers=pattern.count("E"))
        for key, value in derived.items():
            if key not in data:
                kw[key] = value
    kw.setdefault("source", "inline definition")
    for f in fields(ModelSpec):
        if f.default is MISSING and f.name not in kw:
            raise ValueError(f"{f.name}: required")
    for name, value in kw.items():
        t = _FIELD_TYPES[name]
        if t in ("int", "int | None") and not (value is None and t == "int | None"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: must be an integer, got {value!r}")
        elif t == "bool" and not isinstance(value, bool):
            raise ValueError(f"{name}: must be true or false, got {value!r}")
        elif t in ("str", "str | None") and not (value is None and t == "str | None") \
                and not isinstance(value, str):
            raise ValueError(f"{name}: must be a string, got {value!r}")
    return ModelSpec(**kw)

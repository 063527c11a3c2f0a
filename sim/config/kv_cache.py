"""The ``kv_cache`` section of a scenario: how vLLM lays out the KV cache for the
model (dtypes, tensor parallelism, block sizes; see ``sim model NAME``)."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass, fields

from sim.errors import ConfigError
from sim.config.fields import check_int


@dataclass(frozen=True)
class KVCacheSection:
    """How vLLM lays out the KV cache for the model (see ``sim model NAME``)."""

    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    kernel_block_size: int = 16
    block_size: int | None = None            # override the derived attention/Mamba block
    num_gpu_blocks_override: int | None = None
    # vLLM's --kv-cache-memory-bytes: the pool's byte budget per GPU, instead of the one
    # profiled from gpu_memory_utilization (vLLM then ignores the utilization): the pool
    # holds kv_cache_memory_bytes // (bytes of one pool block) blocks, null block included
    kv_cache_memory_bytes: int | None = None
    # GDN (Qwen3-Next) prefill kernel: auto = what vLLM picks on the scenario's GPU
    # (FlashInfer on Hopper; on Blackwell for 128-wide keys), which exports prefill
    # checkpoints on a 64-token grid; triton exports none
    gdn_prefill_backend: str = "auto"
    # internal prefill checkpoints (vLLM's MambaSpec fields); None = as the model's Mamba
    # layer sets them (MambaMixer2 1/1, GDN on FlashInfer 1/grid, MambaMixer 0)
    num_prefill_checkpoint_blocks: int | None = None
    prefill_checkpoint_alignment: int | None = None

    def validate(self, p="kv_cache."):
        check_int(p, "tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.gdn_prefill_backend not in ("auto", "flashinfer", "triton"):
            raise ConfigError(p + "gdn_prefill_backend", f"must be auto, flashinfer or triton, "
                              f"got {show(self.gdn_prefill_backend)}")
        check_int(p, "num_prefill_checkpoint_blocks", self.num_prefill_checkpoint_blocks, 0,
                  allow_none=True)
        check_int(p, "prefill_checkpoint_alignment", self.prefill_checkpoint_alignment, 1,
                  allow_none=True)
        check_int(p, "kernel_block_size", self.kernel_block_size, 1)
        check_int(p, "block_size", self.block_size, 1, allow_none=True)
        check_int(p, "num_gpu_blocks_override", self.num_gpu_blocks_override, 2, allow_none=True)
        check_int(p, "kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1, allow_none=True)
        if self.kv_cache_memory_bytes is not None and self.num_gpu_blocks_override is not None:
            raise ConfigError(p + "kv_cache_memory_bytes", "set either kv_cache_memory_bytes "
                              "(a byte budget per GPU) or num_gpu_blocks_override (a block "
                              "count), not both")
        if self.block_size is not None and self.block_size % self.kernel_block_size:
            k, b = self.kernel_block_size, self.block_size
            lo, hi = (b // k) * k, (b // k + 1) * k
            near = f"{lo} or {hi}" if lo else f"{hi}"
            raise ConfigError(p + "block_size", f"{b} is not a multiple of kernel_block_size {k} "
                              f"(vLLM builds the attention block from whole kernel blocks); use a "
                              f"multiple of {k}, e.g. {near}, or leave it unset to let vLLM derive it")

    def gdn_backend(self, gpu_type: str, model) -> str:
        """The GDN prefill backend vLLM 0.33.0 resolves (``_resolve_gdn_prefill_backend``):
        FlashInfer on Hopper, and on Blackwell when the key head is 128 wide; else Triton."""
        if self.gdn_prefill_backend != "auto":
            return self.gdn_prefill_backend
        from sim.config.gpus import get_gpu

        if get_gpu(gpu_type).compute_capability[0] == 9:
            return "flashinfer"
        return "flashinfer" if getattr(model, "gdn_k_dim", 0) == 128 else "triton"

    def prefill_checkpoints(self, layout, hash_block_size: int | None) -> tuple[int, int]:
        """(num_prefill_checkpoint_blocks, prefill_checkpoint_alignment) for the cache:
        the model's own, then this section's overrides."""
        blocks, align = layout.prefill_checkpoints(hash_block_size)
        if self.num_prefill_checkpoint_blocks is not None:
            blocks = self.num_prefill_checkpoint_blocks
        if self.prefill_checkpoint_alignment is not None:
            align = self.prefill_checkpoint_alignment
        return blocks, align

    def derive(self, model, spec, gpu_type: str = "H200"):
        """The KV layout vLLM derives for the model, this section and the scenario's
        ``SpeculativeSection`` (its drafter's layers included)."""
        from sim.models.layout import derive_layout

        return derive_layout(
            model, tp=self.tensor_parallel_size, mamba_cache_dtype=self.mamba_cache_dtype,
            mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
            kv_cache_dtype=self.kv_cache_dtype, kernel_block_size=self.kernel_block_size,
            block_size=self.block_size, gdn_prefill_backend=self.gdn_backend(gpu_type, model),
            **spec.layout_args())

    def check_layout(self, model, spec, p="kv_cache.", gpu_type: str = "H200") -> None:
        """Derive the KV layout now (cheap), so a dtype, TP, block size or drafter the model
        cannot take fails before anything runs, naming the field (``spec``: the scenario's
        ``SpeculativeSection``)."""
        try:
            layout = self.derive(model, spec, gpu_type)
        except ValueError as e:
            head, sep, rest = str(e).partition(": ")
            names = {"tp": p + "tensor_parallel_size", "speculative_method": "speculative.method",
                     "num_speculative_tokens": "speculative.num_speculative_tokens",
                     **{n: "speculative." + n for n in ("draft_num_layers", "draft_num_kv_heads",
                                                       "draft_head_dim")}}
            if sep and head in names:
                raise ConfigError(names[head], rest) from None
            if sep and head in {f.name for f in fields(self)}:
                raise ConfigError(p + head, rest) from None
            raise ConfigError(p.rstrip("."), str(e)) from None
        given = [n for n in ("draft_num_kv_heads", "draft_head_dim", "draft_num_layers")
                 if getattr(spec, n) is not None] or ["method"]
        from sim.cache.block_pool import GROUP_BITS

        if len(layout.groups) > 1 << GROUP_BITS:
            raise ConfigError("speculative." + given[0], f"vLLM splits this pool into "
                              f"{len(layout.groups)} KV-cache groups (the drafter's own groups "
                              f"make the group size {layout.group_size}); the cache model keys at "
                              f"most {1 << GROUP_BITS}")
        if not layout.uniform_block_size:
            raise ConfigError("speculative." + given[0], f"vLLM unifies this drafter's "
                              f"pages by growing a group's block ({layout.block_size} -> "
                              f"{max(layout.attention_block_size, layout.draft_block_size)} "
                              f"tokens); groups of different block sizes are not simulated yet "
                              f"(see sim model {model.name} --speculative-method "
                              f"{layout.speculative_method})")

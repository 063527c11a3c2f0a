"""The ``kv_cache`` section of a scenario: how vLLM lays out the KV cache for the
model (dtypes, tensor parallelism, block sizes; see ``sim model NAME``)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from sim.config.errors import ConfigError
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

    def validate(self, p="kv_cache."):
        check_int(p, "tensor_parallel_size", self.tensor_parallel_size, 1)
        check_int(p, "kernel_block_size", self.kernel_block_size, 1)
        check_int(p, "block_size", self.block_size, 1, allow_none=True)
        check_int(p, "num_gpu_blocks_override", self.num_gpu_blocks_override, 2, allow_none=True)
        if self.block_size is not None and self.block_size % self.kernel_block_size:
            k, b = self.kernel_block_size, self.block_size
            lo, hi = (b // k) * k, (b // k + 1) * k
            near = f"{lo} or {hi}" if lo else f"{hi}"
            raise ConfigError(p + "block_size", f"{b} is not a multiple of kernel_block_size {k} "
                              f"(vLLM builds the attention block from whole kernel blocks); use a "
                              f"multiple of {k}, e.g. {near}, or leave it unset to let vLLM derive it")

    def check_layout(self, model, spec, p="kv_cache.") -> None:
        """Derive the KV layout now (cheap), so a dtype, TP or block size the model cannot
        take fails before anything runs, naming the field (``spec``: the scenario's
        ``SpeculativeSection``)."""
        from sim.models.layout import derive_layout

        try:
            derive_layout(
                model, tp=self.tensor_parallel_size,
                num_speculative_tokens=spec.num_speculative_tokens if spec.method else 0,
                mamba_cache_dtype=self.mamba_cache_dtype,
                mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
                kv_cache_dtype=self.kv_cache_dtype, kernel_block_size=self.kernel_block_size,
                block_size=self.block_size,
                speculative_method=("mtp" if spec.method == "mtp"
                                    else ("eagle" if spec.method else "auto")))
        except ValueError as e:
            head, sep, rest = str(e).partition(": ")
            names = {"tp": p + "tensor_parallel_size", "speculative_method": "speculative.method",
                     "num_speculative_tokens": "speculative.num_speculative_tokens"}
            if sep and head in names:
                raise ConfigError(names[head], rest) from None
            if sep and head in {f.name for f in fields(self)}:
                raise ConfigError(p + head, rest) from None
            raise ConfigError(p.rstrip("."), str(e)) from None

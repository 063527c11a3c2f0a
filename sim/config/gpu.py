"""The ``gpu`` section of a scenario: which GPU preset (``sim/config/gpus.py``), how
many, and vLLM's ``gpu_memory_utilization``."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from sim.errors import ConfigError
from sim.config.fields import check_int, check_num


@dataclass(frozen=True)
class GPUSection:
    type: str = "H200"
    count: int = 1
    gpu_memory_utilization: float = 0.9

    def validate(self, p="gpu."):
        from sim.config.gpus import get_gpu, gpu_names

        try:
            get_gpu(self.type)
        except KeyError:
            raise ConfigError(p + "type", f"unknown GPU {show(self.type)} (known: "
                              f"{', '.join(gpu_names())})") from None
        check_int(p, "count", self.count, 1)
        check_num(p, "gpu_memory_utilization", self.gpu_memory_utilization, 0.01, 1.0)

"""The ``backend`` section of a scenario: what times a step (the analytical cost
model, or real compute with torch) and its settings."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from sim.errors import ConfigError
from sim.config.fields import check_int, check_num


@dataclass(frozen=True)
class BackendSection:
    kind: str = "analytical"      # analytical | torch
    mfu: float = 0.5              # achieved fraction of peak FLOP/s
    mbu: float = 0.7              # achieved fraction of HBM bandwidth
    overhead_s: float = 0.004     # fixed per-step cost (scheduling, launch)
    profile: str | None = None    # calibration profile (YAML) overriding the three above
    # torch backend: the model's layer stack, optionally scaled down for CPU runs
    layers: int | None = None     # first N layers of the pattern (default: all)
    width_div: int = 1            # divide widths and head counts by this
    dtype: str = "float32"        # float32 | bfloat16 (the SSM state stays float32)
    device: str = "auto"          # auto (cuda when present) | cpu | cuda
    verify: bool = False          # compare every resumed prefill with a from-scratch one

    def validate(self, p="backend."):
        if self.kind not in ("analytical", "torch"):
            raise ConfigError(p + "kind", f"unknown backend {show(self.kind)} (available: analytical, torch)")
        check_int(p, "layers", self.layers, 1, allow_none=True)
        check_int(p, "width_div", self.width_div, 1)
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(p + "dtype", f"must be float32 or bfloat16, got {show(self.dtype)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(p + "device", f"must be auto, cpu or cuda, got {show(self.device)}")
        if not isinstance(self.verify, bool):
            raise ConfigError(p + "verify", f"must be true or false, got {show(self.verify)}")
        check_num(p, "mfu", self.mfu, 1e-6, 1.0)
        check_num(p, "mbu", self.mbu, 1e-6, 1.0)
        check_num(p, "overhead_s", self.overhead_s, 0.0)

"""Configuration: the scenario and its sections, the one input-error family and the
one YAML/JSON loader every input file goes through.

* ``scenario`` -- a scenario file: load, ``--set`` overrides, validation, ``Scenario``.
* ``cache``, ``scheduler``, ``speculative``, ``kv_cache``, ``gpu``, ``backend`` -- one
  typed section each (vLLM's names); ``gpus`` -- the GPU presets and the pool's size.
* ``errors`` (``InputError``, ``ConfigError``), ``loader``, ``fields`` -- shared by all.

Old names of cache fields are accepted through the one table ``ALIASES`` in
``sim/cache/config.py`` (the cache's own configuration, where the names are defined).
"""

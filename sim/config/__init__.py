"""Configuration: the scenario and its sections, the one input-error family and the
one YAML/JSON loader every input file goes through."""

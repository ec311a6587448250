"""The run config: one YAML file validated once into a hashable RunConfig, its sections, and its text side (overrides, errors)."""

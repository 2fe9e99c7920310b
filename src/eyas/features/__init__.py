"""The feature store (sharded safetensors + manifest) and the extraction loop that fills it."""

"""Target models: locating their files, fingerprints, tokenizers (weights come later)."""

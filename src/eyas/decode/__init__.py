"""Speculative decoding: draft trees, verification, the decoder and `eyas eval`."""

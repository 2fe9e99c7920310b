"""Helpers that build tiny, offline targets for tests, benchmarks and the small demo."""

"""Speculative decoding: drafters propose tokens, the batched step verifies them (rejection sampling)."""

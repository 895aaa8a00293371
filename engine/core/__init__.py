"""The scheduler's side of the engine: requests, the step plan, KV block accounting and the prefix
cache. Plain Python: nothing here imports MLX or knows a device.
"""

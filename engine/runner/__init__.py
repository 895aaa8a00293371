"""Runs the model for one plan: the paged KV storage and attention that any device uses, and the one
place (backends.py) that picks each device's fast paths.
"""

"""Turning chat messages and images into the model's inputs: chat templates and image processors."""

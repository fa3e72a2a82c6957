"""Trainable generative models: the DiHAL hidden-state bridge and the DSL denoiser (not yet built)."""

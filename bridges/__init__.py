"""Trainable generative models: the DSL channel and denoiser, the DiHAL hidden-state bridge,
and the one training loop they share (docs/architecture.md)."""

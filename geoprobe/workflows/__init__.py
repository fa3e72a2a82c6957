"""The application layer: what a command runs end to end over the core (geoprobe's own modules),
the samplers and the trainable models (bridges/): the layer sweep and its verdict, sampling,
evaluation, the comparison, the report page and the demo. Nothing below imports it
(tests/test_layout.py; docs/architecture.md)."""

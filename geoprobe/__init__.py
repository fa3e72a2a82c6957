"""geoprobe: where can diffusion enter a pretrained language model?

The toolkit measures the geometry of every layer's hidden states, ranks the layers, and
(with the sibling packages `bridges` and `samplers`) trains and samples diffusion models at
the chosen interface. See DESIGN.md for the architecture and README.md for the CLI.
"""

__version__ = "0.1.0"

_API = ("Run", "open_run", "scan", "bridge", "sample")


def __getattr__(name):
    """`geoprobe.open_run`, `geoprobe.scan`, ... (imported on first use: pandas stays out of the CLI's start-up)."""
    if name in _API:
        from geoprobe import api

        return getattr(api, name)
    raise AttributeError(f"module 'geoprobe' has no attribute {name!r}")

"""geoprobe: where can diffusion enter a pretrained language model?

The toolkit measures the geometry of every layer's hidden states, ranks the layers, and
(with the sibling packages `bridges` and `samplers`) trains and samples diffusion models at
the chosen interface. See docs/architecture.md for the architecture and README.md for the CLI.
"""


_API = ("Run", "open_run", "scan", "bridge", "sample")


def __getattr__(name):
    """`geoprobe.open_run`, `geoprobe.scan`, ... (imported on first use: pandas stays out of the CLI's start-up)."""
    if name == "__version__":  # pyproject.toml owns the number; read only when asked
        from importlib.metadata import version

        return version("geoprobe")
    if name in _API:
        from geoprobe import api

        return getattr(api, name)
    raise AttributeError(f"module 'geoprobe' has no attribute {name!r}")

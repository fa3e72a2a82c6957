"""geoprobe: where can diffusion enter a pretrained language model?

The toolkit measures the geometry of every layer's hidden states, ranks the layers, and
(with the sibling packages `bridges` and `samplers`) trains and samples diffusion models at
the chosen interface. See DESIGN.md for the architecture and README.md for the CLI.
"""

__version__ = "0.1.0"

"""Numbers computed from results: rank correlations (correlation.py) and text statistics (text.py); workflows/evaluate.py runs an evaluator LM over samples files."""

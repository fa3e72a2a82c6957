"""Numbers computed from results: rank correlations now; Gen.PPL, diversity, MAUVE to come."""

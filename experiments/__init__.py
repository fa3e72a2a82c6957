"""The experiments that write docs pages: long, resumable runs, each a module run as
`python -m experiments.NAME` from the repository root (the Makefile's `results` targets).

    smollm2_results        docs/results.md: the sweep verdict on SmolLM2 (and, with --generation,
                           the generation comparison)
    testbed_results        docs/testbed.md: the DSL paper's comparisons on the testbed, with seeds
    baselines_results      docs/baselines.md: the DiHAL comparison with the embedding-diffusion baselines
                           (--run 3: its run 3, the decodings of issue 61)
    baselines_sensitivity  docs/baselines-sensitivity.md: the baselines' deviations from their papers
    parallel_sweep         the SmolLM2 sweep, one layer per process

Two modules serve them all: records.py keeps the finished runs' records (copied into the tracked
experiments/records/ and back) and reads a run's progress; pages.py writes the pages' openings,
figures and tables. bench/bridge_design.py uses records.py too; nothing in experiments/ imports
bench/ except the SmolLM2 page's line on the shape study.

They are not examples (examples/ shows a user the commands) and not the library (nothing in
geoprobe/, bridges/ or samplers/ imports them). What they share with the demo's testbed experiment
they read from geoprobe.workflows.demo (TINY) instead of restating it."""

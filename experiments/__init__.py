"""The experiments that write docs pages: long, resumable runs of library calls, each a module run
as `python -m experiments.NAME` from the repository root (the Makefile's `results` targets).

    testbed_results   docs/testbed.md: the DSL paper's comparisons on the testbed, with seeds
    smollm2_results   docs/results.md: the sweep verdict on SmolLM2 (and, with --generation, the
                      generation comparison)

They are not examples (examples/ shows a user the commands) and not the library (nothing in
geoprobe/, bridges/ or samplers/ imports them); what they share with the demo's testbed experiment
they read from geoprobe.workflows.demo (TINY) instead of restating it."""

"""The scan pipeline opens a run once: a rerun of a finished scan reads manifest.json once and
gives the same ranking."""

import json

import geoprobe.store as store
from tests.helpers import SCAN, copy_run, flags, invoke


def test_a_rerun_of_a_finished_scan_reads_its_manifest_once(scanned_run, tiny_models, corpus_txt, tmp_path,
                                                            monkeypatch):
    run = copy_run(scanned_run, tmp_path / "run")
    before = (run / "ranking.csv").read_text()
    reads = []
    real = store.read_json

    def counting(path, *args, **kwargs):
        reads.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(store, "read_json", counting)  # read_manifest's one way to the file
    code, out, err = invoke("--format", "json", "scan", tiny_models("llama"), "--corpus", corpus_txt, *flags(SCAN),
                            "--out", run)
    assert code == 0, err
    # the scan's library call: once to decide that the extraction is finished, then the opened run
    # serves the geometry's reuse check, the timing and the ranking (it was 4 reads)
    assert reads.count(store.MANIFEST) == 1
    assert (run / "ranking.csv").read_text() == before
    assert json.loads(out)["timing"]["rows"] == json.loads((run / store.MANIFEST).read_text())["rows"]

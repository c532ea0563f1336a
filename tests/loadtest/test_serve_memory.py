"""The memory bench measures a real `parley serve --workers 2`, with and without hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.serve_memory import main
from tests.web.test_workers import HOSTED


@pytest.mark.slow
def test_the_memory_bench_prints_a_row_per_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))  # the fake engine
    graph = tmp_path / "hosted.yaml"
    graph.write_text(HOSTED)
    main(["--pipeline", str(graph), "--workers", "2", "--settle-s", "0.5"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["2", "on"], ["2", "off"]]
    hosted, own = (
        {"total": float(r[2]), "hosts": float(r[5]), "stages": float(r[6])} for r in rows
    )
    assert hosted["hosts"] > 0 and hosted["stages"] == 0
    assert own["hosts"] == 0 and own["stages"] > 0

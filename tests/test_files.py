"""rarelm/files.py: atomic writers."""

import pytest

from rarelm.files import write_csv


def test_write_csv_writes_the_plots_format(tmp_path):
    path = tmp_path / "plots" / "train.csv"
    rows = [{"step": 0, "loss": 2.0 / 3, "val_ce": None, "lr": 1e-4},
            {"step": 10, "loss": float("nan"), "lr": 123456789.0}]
    write_csv(path, ["step", "loss", "val_ce", "lr"], rows)
    assert path.read_bytes() == b"step,loss,val_ce,lr\n0,0.666667,,0.0001\n10,,,1.23457e+08\n"
    assert not list(path.parent.glob(".*"))  # no temporary file left beside it


def test_write_csv_keeps_cells_as_given_and_quotes_commas(tmp_path):
    path = tmp_path / "weights.csv"
    write_csv(path, ["log10_weight", "samples"], [{"log10_weight": -1.234567, "samples": 3}], cell=str)
    assert path.read_text() == "log10_weight,samples\n-1.234567,3\n"
    write_csv(path, ["band", "terms"], [{"band": "2,3", "terms": 1}])
    assert path.read_text() == 'band,terms\n"2,3",1\n'


def test_write_csv_leaves_the_old_file_when_rows_fail(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("old\n")

    def rows():
        yield {"a": 1}
        raise ValueError("half-way")

    with pytest.raises(ValueError):
        write_csv(path, ["a"], rows())
    assert path.read_text() == "old\n"

import pytest

from rarelm.errors import RarelmError
from rarelm.params import Params, load_params
from tests.conftest import REPO


def test_repo_params_load_and_match_defaults_types():
    params = load_params(REPO / "params.yaml")
    assert params.corpus.path == "data/raw/demo_en.txt.gz"
    assert params.alpha == 0.0 and isinstance(params.alpha, float)
    flat = params.flat()
    assert flat["alpha"] == 0.0 and flat["corpus.val_fraction"] == 0.1
    assert "train.lr" in flat and "." not in "".join(k for k in flat if "." not in k)


def test_int_is_accepted_for_float_and_converted():
    params = Params.from_dict({"alpha": 1, "corpus": {"val_fraction": 0}})
    assert params.alpha == 1.0 and isinstance(params.alpha, float)
    assert params.corpus.val_fraction == 0.0


@pytest.mark.parametrize(("raw", "message"), [
    ({"alpha": -1}, "params: alpha = -1 is not allowed (must be >= 0)"),
    ({"alpha": "high"}, "params: alpha = 'high' is not allowed (must be a number)"),
    ({"seed": 1.5}, "params: seed = 1.5 is not allowed (must be an integer)"),
    ({"seed": True}, "params: seed = True is not allowed (must be an integer)"),
    ({"corpus": {"val_fraction": 1.0}},
     "params: corpus.val_fraction = 1.0 is not allowed (must be < 1)"),
    ({"corpus": {"val_fraction": 0.6, "test_fraction": 0.5}},
     "params: corpus.val_fraction + corpus.test_fraction = 1.1 is not allowed (must be < 1)"),
    ({"corpus": {"language": "fr"}},
     "params: corpus.language = 'fr' is not allowed (must be one of en, zh, auto)"),
    ({"corpus": {"dedup": "yes"}}, "params: corpus.dedup = 'yes' is not allowed (must be true or false)"),
    ({"corpus": {"pathh": "x"}}, "params: unknown key corpus.pathh (allowed in corpus: path,"),
    ({"bogus": 1}, "params: unknown key bogus (allowed in params.yaml: seed, alpha,"),
    ({"corpus": 3}, "params: corpus = 3 is not allowed (must be a mapping)"),
    ({"tokenizer": {"vocab_size": 10}},
     "params: tokenizer.vocab_size = 10 is not allowed (must be >= 260)"),
    ({"tokenizer": {"cjk": "words"}},
     "params: tokenizer.cjk = 'words' is not allowed (must be one of chars, merge)"),
    ({"corpus": {"split_seed": -1}}, "params: corpus.split_seed = -1 is not allowed (must be >= 0)"),
    ({"eval": {"threads": -1}}, "params: eval.threads = -1 is not allowed (must be >= 0)"),
    ({"eval": {"closed_set": "no"}}, "params: eval.closed_set = 'no' is not allowed (must be true or false)"),
])
def test_bad_values_name_key_value_and_allowed(raw, message):
    with pytest.raises(RarelmError) as err:
        Params.from_dict(raw)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_load_params_file_errors(tmp_path):
    with pytest.raises(RarelmError, match="params file not found"):
        load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("alpha: [1,\n")
    with pytest.raises(RarelmError, match="not valid YAML"):
        load_params(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_params(empty) == Params()


def test_true_and_false_choices_accept_yaml_booleans():
    # `dvc exp run -S tracking.log_model=false` writes a YAML boolean, not the string "false"
    from rarelm.params import Params

    assert Params.from_dict({"tracking": {"log_model": False}}).tracking.log_model == "false"
    assert Params.from_dict({"tracking": {"log_model": True}}).tracking.log_model == "true"

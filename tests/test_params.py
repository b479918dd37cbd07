import sys

import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.params import Params, load_params
from tests.conftest import BIN, REPO, run


def test_repo_params_load_and_match_defaults_types():
    params = load_params(REPO / "params.yaml")
    assert params.corpus.path == "data/raw/demo_en.txt.gz"
    assert params.alpha == 0.0 and isinstance(params.alpha, float)
    flat = params.flat()
    assert flat["alpha"] == 0.0 and flat["corpus.val_fraction"] == 0.1
    assert "train.lr" in flat and "." not in "".join(k for k in flat if "." not in k)


def test_defaults_equal_params_yaml():
    """Params() is what params.yaml says: a stage run with a partial params file gets the demo's values."""
    defaults, repo = Params().flat(), load_params(REPO / "params.yaml").flat()
    assert {k: (v, repo[k]) for k, v in defaults.items() if v != repo[k]} == {}
    assert defaults["train.max_steps"] == 1000 and set(defaults) == set(repo)


def test_int_is_accepted_for_float_and_converted():
    params = Params.from_dict({"alpha": 1, "corpus": {"val_fraction": 0}})
    assert params.alpha == 1.0 and isinstance(params.alpha, float)
    assert params.corpus.val_fraction == 0.0


def test_exponent_without_a_dot_is_a_number(tmp_path):
    """PyYAML reads 5e-5 (no dot) as a string, as `dvc exp run -S train.min_lr=5e-5` writes it."""
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: 5e-4\n  min_lr: '5E-05'\n", encoding="utf-8")
    params = load_params(path)
    assert (params.train.lr, params.train.min_lr) == (5e-4, 5e-5)
    with pytest.raises(RarelmError, match="must be a number"):
        Params.from_dict({"train": {"lr": "5e-4x"}})


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
    # non-finite and absurd values (issue 25): each float finite and bounded, seeds 32-bit
    ({"train": {"lr": float("inf")}}, "params: train.lr = inf is not allowed (must be a finite number)"),
    ({"train": {"lr": 1e300}}, "params: train.lr = 1e+300 is not allowed (must be <= 10)"),
    ({"alpha": float("nan")}, "params: alpha = nan is not allowed (must be a finite number)"),
    ({"alpha": 1e300}, "params: alpha = 1e+300 is not allowed (must be <= 100)"),
    ({"alpha": 10**400}, "params: alpha = 10000000000"),  # 401 digits, shown as 200 with "..."
    ({"loss": {"rare_weight": 1e300}}, "params: loss.rare_weight = 1e+300 is not allowed (must be <= 10000)"),
    ({"train": {"grad_clip": float("inf")}},
     "params: train.grad_clip = inf is not allowed (must be a finite number)"),
    ({"loss": {"tlat_t": float("-inf")}},
     "params: loss.tlat_t = -inf is not allowed (must be a finite number)"),
    ({"weights": {"clip_ratio": 1e300}},
     "params: weights.clip_ratio = 1e+300 is not allowed (must be <= 1e+12)"),
    ({"seed": 2**64}, "params: seed = 18446744073709551616 is not allowed (must be an integer of at most"),
    ({"seed": 2**32}, "params: seed = 4294967296 is not allowed (must be <= 4294967295)"),
    ({"corpus": {"split_seed": 2**32}},
     "params: corpus.split_seed = 4294967296 is not allowed (must be <= 4294967295)"),
    # kNN-LM on with no weight would build a datastore nothing reads (the cache needs none)
    ({"knn": {"enabled": True, "weight": 0, "cache_window": 8, "cache_weight": 0.1}},
     "params: knn.enabled = true with knn.weight = 0 is not allowed (it builds a datastore nothing reads;"),
    ({"knn": {"enabled": True, "weight": 0.5, "cache_window": 8, "cache_weight": 0.6}},
     "params: knn.weight + knn.cache_weight = 1.1 is not allowed (must be <= 1)"),
    ({"eval": {"term_trie_min_mass": 1.0}},
     "params: eval.term_trie_min_mass = 1.0 is not allowed (must be < 1)"),
    ({"eval": {"term_trie_min_mass": 0.3}},
     "params: eval.term_trie_min_mass = 0.3 gates the term trie, which is off (set eval.term_trie: true)"),
    ({"tracking": {"experiment": " "}}, "params: tracking.experiment = ' ' is not allowed (must be 1 to 256 "
     "characters, not only spaces, without control characters)"),
    ({"tracking": {"experiment": "a\nb"}}, "params: tracking.experiment = 'a\\nb' is not allowed"),
    ({"tracking": {"experiment": "x" * 257}}, "params: tracking.experiment = 'xxx"),
])
def test_bad_values_name_key_value_and_allowed(raw, message):
    with pytest.raises(RarelmError) as err:
        Params.from_dict(raw)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_the_cache_alone_needs_no_knn_switch():
    """The cache's weight is checked against kNN-LM's only when kNN-LM is on."""
    knn = Params.from_dict({"knn": {"cache_window": 8, "cache_weight": 0.9}}).knn
    assert not knn.enabled and knn.weight == 0.25 and knn.cache_weight == 0.9


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


def test_every_float_param_has_an_upper_bound_and_seeds_are_32_bit():
    """No float field is left unbounded above (1e300 passes none); the defaults sit inside."""
    import dataclasses
    import typing

    def walk(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                yield prefix + f.name, hints[f.name], f.metadata

    floats = {key: bounds for key, hint, bounds in walk(Params) if hint is float}
    assert len(floats) > 20
    assert [key for key, bounds in floats.items() if not {"le", "lt"} & set(bounds)] == []
    seeds = {key: bounds for key, _, bounds in walk(Params) if key.endswith("seed")}
    assert seeds == {"seed": {"ge": 0, "le": 2**32 - 1}, "corpus.split_seed": {"ge": 0, "le": 2**32 - 1}}
    assert load_params(REPO / "params.yaml") is not None and Params() is not None


def test_non_finite_params_file_is_one_line_from_a_stage(tmp_path):
    """`dvc exp run -S train.lr=inf` writes `.inf`: the stage refuses it in one line, exit 2."""
    import shutil
    import subprocess
    import sys

    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    params.write_text(params.read_text().replace("  lr: 0.003", "  lr: .inf"))
    result = subprocess.run([sys.executable, "-m", "stages.train", "--params", str(params),
                             "--out", str(tmp_path / "model")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("rarelm train: error: params: train.lr = inf is not allowed "
                                     "(must be a finite number)")
    assert not (tmp_path / "model").exists()


def test_billion_laughs_params_file_is_refused_at_once(tmp_path):
    """`corpus.path` a list of YAML aliases nested 9 deep (10^9 strings if expanded): the stage
    says one line naming the key, within 1 GB of address space (the value is shared on load, and
    the message shows a bounded repr of it, where the full one would be gigabytes). `dvc status`
    on such a file is DVC's own parser's business: docs/reliability.md."""
    import resource
    import subprocess
    import sys

    levels = ['&a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    params = tmp_path / "params.yaml"
    params.write_text("corpus:\n  path: [" + ", ".join(levels) + "]\n")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    result = subprocess.run([sys.executable, "-m", "stages.prepare", "--params", str(params),
                             "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True,
                            text=True, preexec_fn=limit, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip()
    assert line.startswith("rarelm prepare: error: params: corpus.path = [['lol', 'lol', ") and \
        line.endswith("] is not allowed (must be a string)") and len(line) < 1000, line


# Read differently by PyYAML (YAML 1.1) and by DVC (ruamel.yaml, YAML 1.2), but `1_7` (17 for both):
# `0o17` is 15 in YAML 1.2 and a string in 1.1, `1e-1` a float and a string, `1:20` a string and 80.
TRICKY = """\
seed: 0o17
alpha: 1e-1
corpus:
  split_seed: 1_7
  text_field: 1:20
train:
  max_steps: 010
  lr: 5e-4
"""


def test_params_are_read_as_dvc_reads_them(tmp_path):
    """Both readers on the same file: rarelm's values are DVC's (PyYAML's were not: max_steps 8)."""
    from dvc.utils.serialize import parse_yaml

    path = tmp_path / "params.yaml"
    path.write_text(TRICKY)
    dvc = parse_yaml(TRICKY, str(path))
    ours = load_params(path)
    assert (ours.seed, ours.alpha, ours.corpus.split_seed, ours.corpus.text_field,
            ours.train.max_steps, ours.train.lr) == \
        (dvc["seed"], dvc["alpha"], dvc["corpus"]["split_seed"], dvc["corpus"]["text_field"],
         dvc["train"]["max_steps"], dvc["train"]["lr"]) == (15, 0.1, 17, "1:20", 10, 0.0005)
    pyyaml = yaml.safe_load(TRICKY)  # what the stages read before
    assert (pyyaml["seed"], pyyaml["corpus"]["text_field"], pyyaml["train"]["max_steps"]) == \
        ("0o17", 80, 8)


DUPLICATED = "train:\n  lr: 0.01\n  batch_size: 4\nalpha: 0.0\ntrain:\n  lr: 0.003\n"


@pytest.mark.parametrize("command", [["python", "-m", f"stages.{name}"] for name in
                                     ("check", "prepare", "tokenize", "rare_terms", "weights", "train",
                                      "datastore", "evaluate")]
                         + [["rarelm", "prepare"], ["rarelm", "register", "x"]],
                         ids=lambda c: " ".join(c[-2:]))
def test_a_key_given_twice_is_refused_by_every_stage_and_command(tmp_path, command):
    """A second `train:` section appended by hand: DVC refuses the file; the stages took the last
    one silently (lr 0.01 became 0.003). Now one line, exit 2, before anything is written."""
    (tmp_path / "params.yaml").write_text(DUPLICATED)
    exe = [sys.executable] if command[0] == "python" else [str(BIN / command[0])]
    result = run([*exe, *command[1:], "--params", "params.yaml"], tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert ': error: params file params.yaml: key "train" appears twice (again at line 5); keep one' \
        in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]

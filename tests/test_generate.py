"""`rarelm generate`: streaming continuation of a prompt with a saved causal LM folder."""

from __future__ import annotations

import pytest
import torch

from rarelm.errors import RarelmError
from rarelm.generate import Sampling, generate
from rarelm.lm import load_causal_lm, load_tokenizer
from tests.conftest import run

TEXTS = ["the patient presented with acute myocardial infarction and chest pain",
         "a rare case of idiopathic pneumomyositis treated with heparin",
         "the nodular lesion was removed and the patient recovered"] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random GPT-2 with a real BPE tokenizer, saved as a Hugging Face folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rarelm.tokenization import EOT, save_hf_tokenizer, train_bpe

    out = tmp_path_factory.mktemp("model")
    tokenizer = train_bpe(iter(TEXTS), vocab_size=300, min_frequency=1)
    save_hf_tokenizer(tokenizer, out)
    eot = tokenizer.token_to_id(EOT)
    torch.manual_seed(0)  # large init: varied, non-repeating greedy output
    GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                               n_head=2, bos_token_id=eot, eos_token_id=eot,
                               initializer_range=0.5)).save_pretrained(out)
    return out


def argmax_loop(model, ids: list[int], n: int, eos: int) -> list[int]:
    """Greedy decoding the slow, obvious way: full forward per token, no cache."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
    return out


class Recorder:
    def __init__(self):
        self.pieces: list[str] = []

    def write(self, text: str) -> None:
        self.pieces.append(text)

    def flush(self) -> None:
        pass


def test_cli_greedy_streams_the_argmax_continuation(model_dir):
    result = run(["rarelm", "generate", "the patient presented", "--model", str(model_dir),
                  "--greedy", "--max-tokens", "12"], model_dir, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    model, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    prompt_ids = tok("the patient presented").input_ids
    want = argmax_loop(model, prompt_ids, 12, tok.eos_token_id)
    assert len(set(want)) > 3
    assert result.stdout == "the patient presented" + tok.decode(want, skip_special_tokens=True) + "\n"


def test_streams_piece_by_piece_and_sampling_repeats_by_seed(model_dir):
    model, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    out = Recorder()
    ids = generate(model, tok, "a rare case", Sampling(max_tokens=10, seed=1, temperature=1.0), out)
    assert len(out.pieces) > 2 and "".join(out.pieces) == tok.decode(ids, skip_special_tokens=True) + "\n"
    again = generate(model, tok, "a rare case", Sampling(max_tokens=10, seed=1, temperature=1.0))
    other = generate(model, tok, "a rare case", Sampling(max_tokens=10, seed=2, temperature=1.0))
    assert ids == again and ids != other
    # top-k 1 sampling is greedy whatever the seed
    top1 = generate(model, tok, "a rare case", Sampling(max_tokens=10, seed=5, top_k=1))
    assert top1 == argmax_loop(model, tok("a rare case").input_ids, 10, tok.eos_token_id)
    # an empty prompt starts from the end-of-text token
    assert len(generate(model, tok, "", Sampling(max_tokens=3, greedy=True))) >= 1


def test_prompt_too_long_for_the_context(model_dir):
    model, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    with pytest.raises(RarelmError, match="exceeds the model's context of 64 tokens"):
        generate(model, tok, "the patient " * 40, Sampling(max_tokens=10))


def test_folder_without_tokenizer(tmp_path, model_dir):
    (tmp_path / "config.json").write_text((model_dir / "config.json").read_text())
    with pytest.raises(RarelmError, match="no loadable tokenizer"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("args,message", [
    (["--model", "no/such/folder"], "rarelm generate: error: no/such/folder: no such model folder"),
    (["--temperature", "0"], "rarelm generate: error: --temperature = 0.0 is not allowed (must be > 0)"),
    (["--top-p", "1.5"], "--top-p = 1.5 is not allowed (must be in (0, 1])"),
])
def test_bad_input_is_one_line(model_dir, args, message):
    model_args = [] if "--model" in args else ["--model", str(model_dir)]
    result = run(["rarelm", "generate", "hello", *model_args, *args], model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr

"""`rarelm generate`: streaming continuation of a prompt with a saved causal LM folder."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rarelm.artifacts.buckets import log_prior
from rarelm.errors import RarelmError
from rarelm.evaluate.decoding import greedy_continue, logit_adjustment, logit_bias_processor
from rarelm.evaluate.generate import Sampling, generate
from rarelm.evaluate.model_folder import load_causal_lm, load_model_tokenizer
from tests.conftest import run
from tests.helpers import TEXTS, argmax_loop


class Recorder:
    def __init__(self):
        self.pieces: list[str] = []

    def write(self, text: str) -> None:
        self.pieces.append(text)

    def flush(self) -> None:
        pass


def test_cli_greedy_streams_the_argmax_continuation(generate_model_dir):
    result = run(["rarelm", "generate", "the patient presented", "--model", str(generate_model_dir),
                  "--greedy", "--max-tokens", "12"], generate_model_dir, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
    prompt_ids = tok("the patient presented").input_ids
    want = argmax_loop(model, prompt_ids, 12, tok.eos_token_id)
    assert len(set(want)) > 3
    assert result.stdout == "the patient presented" + tok.decode(want, skip_special_tokens=True) + "\n"


def test_streams_piece_by_piece_and_sampling_repeats_by_seed(generate_model_dir):
    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
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


def test_a_prompt_too_long_for_the_context_keeps_its_end(generate_model_dir, capsys):
    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
    prompt = "the patient presented with " * 20
    assert len(tok(prompt).input_ids) > 64
    ids = generate(model, tok, prompt, Sampling(max_tokens=10, greedy=True))
    assert ids == argmax_loop(model, tok(prompt).input_ids[-54:], 10, tok.eos_token_id)
    assert capsys.readouterr().err.strip().endswith(
        "exceeds the model's context of 64 tokens: keeping the prompt's last 54 tokens")
    with pytest.raises(RarelmError, match="--max-tokens 64 leaves no room for the prompt"):
        generate(model, tok, "the", Sampling(max_tokens=64))


def test_folder_without_tokenizer(tmp_path, generate_model_dir):
    (tmp_path / "config.json").write_text((generate_model_dir / "config.json").read_text())
    with pytest.raises(RarelmError, match="no loadable tokenizer"):
        load_model_tokenizer(tmp_path)


@pytest.mark.parametrize("args,message", [
    (["--model", "no/such/folder"], "rarelm generate: error: no/such/folder: no such model folder"),
    (["--temperature", "0"], "rarelm generate: error: --temperature = 0.0 is not allowed (must be in "
                             "[0.001, 1000]; --greedy takes the likeliest token)"),
    (["--top-p", "1.5"], "--top-p = 1.5 is not allowed (must be in (0, 1])"),
    # issue 43: were tracebacks of 108 and 84 lines
    (["--temperature", "1e-45"], "rarelm generate: error: --temperature = 1e-45 is not allowed"),
    (["--seed", "99999999999999999999"], "--seed = 99999999999999999999 is not allowed (must be in "
                                         "0..4294967295)"),
    (["--max-tokens", "10000000"], "--max-tokens = 10000000 is not allowed (must be in 1..1000000)"),
    (["--logit-adjust", "inf"], "--logit-adjust = inf is not allowed (must be in [0, 100] (0 = off))"),
    (["--top-k", "-1"], "--top-k = -1 is not allowed (must be in 0..10000000 (0 = off))"),
])
def test_bad_input_is_one_line(generate_model_dir, args, message):
    model_args = [] if "--model" in args else ["--model", str(generate_model_dir)]
    result = run(["rarelm", "generate", "hello", *model_args, *args], generate_model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_a_prompt_of_invalid_utf8_is_one_line_and_control_characters_are_echoed_escaped(generate_model_dir):
    """Issue 43: `rarelm generate $'\\xff'` was 62 lines of traceback; an escape sequence in a
    prompt was echoed raw, so it drove the terminal (here: clear the screen)."""
    result = run(["rarelm", "generate", "caf\udcff", "--model", str(generate_model_dir)], generate_model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("rarelm generate: error: argument 2 (b'caf\\xff') is not valid UTF-8 "
                             "(byte 0xff at offset 3); pass text in UTF-8\n")
    result = run(["rarelm", "generate", "the\x1b[2J patient\x07", "--model", str(generate_model_dir),
                  "--greedy", "--max-tokens", "3"], generate_model_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the\\x1b[2J patient\\x07") and "\x1b" not in result.stdout


# ---------------------------------------------------------------- post-hoc logit adjustment


def train_counts(generate_model_dir) -> np.ndarray:
    """Token counts of TEXTS, as the rare_terms stage writes them (int64 [vocabulary])."""
    tok = load_model_tokenizer(generate_model_dir)
    ids = [i for text in TEXTS for i in tok(text).input_ids]
    return np.bincount(ids, minlength=len(tok)).astype(np.int64)


def test_a_prior_flips_the_argmax_by_hand():
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=3), device="cpu")  # logits wider than the prior
    prior = log_prior(np.array([99, 0]))  # add-one: pi = (100, 1) / 101
    assert logit_adjustment(model, prior, 0.0) is None  # tau 0: no adjustment at all
    bias = logit_adjustment(model, prior, 0.5)
    # -0.5 * log pi: +0.5 ln(101/100) for the frequent token, +0.5 ln 101 for the unseen one, 0 past the prior
    assert bias.dtype == torch.float32
    assert bias.tolist() == pytest.approx([0.5 * math.log(1.01), 0.5 * math.log(101), 0.0], rel=1e-6)
    logits = torch.tensor([[2.0, 1.5, 1.9]])  # argmax 0; adjusted (2.005, 3.808, 1.9): argmax 1
    assert int(logits.argmax()) == 0
    adjusted = logit_bias_processor(bias)(torch.zeros((1, 1), dtype=torch.long), logits)
    assert adjusted.tolist()[0] == pytest.approx([2.0 + 0.5 * math.log(1.01), 1.5 + 0.5 * math.log(101), 1.9])
    assert int(adjusted.argmax()) == 1
    with pytest.raises(RarelmError, match="prior covers 4 token ids, more than the model's vocabulary of 3"):
        logit_adjustment(model, log_prior(np.zeros(4)), 1.0)


def test_adjusted_greedy_decoding_is_the_argmax_of_adjusted_logits(generate_model_dir):
    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
    prior = log_prior(train_counts(generate_model_dir))
    prompts = [tok("the patient presented").input_ids, tok("a rare case of").input_ids]
    plain = greedy_continue(model, prompts, 10, pad_id=0)
    assert torch.equal(greedy_continue(model, prompts, 10, 0, logit_adjustment(model, prior, 0.0)), plain)
    bias = logit_adjustment(model, prior, 2.0)
    adjusted = greedy_continue(model, prompts, 10, 0, bias)
    assert not torch.equal(adjusted, plain)
    for p, row in zip(prompts, adjusted.tolist(), strict=True):  # the batched, cached decode is exact
        assert row == argmax_loop(model, p, 10, None, bias)
    # tokens rare in train are written more often once lifted
    counts = train_counts(generate_model_dir)
    assert np.median(counts[adjusted.flatten()]) <= np.median(counts[plain.flatten()])


def test_cli_logit_adjust_streams_the_adjusted_argmax(generate_model_dir, tmp_path):
    counts = tmp_path / "counts.npy"
    np.save(counts, train_counts(generate_model_dir))
    args = ["rarelm", "generate", "the patient presented", "--model", str(generate_model_dir), "--greedy",
            "--max-tokens", "12"]
    result = run([*args, "--logit-adjust", "2", "--counts", str(counts)], generate_model_dir,
                 env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
    prompt_ids = tok("the patient presented").input_ids
    bias = logit_adjustment(model, log_prior(np.load(counts)), 2.0)
    want = argmax_loop(model, prompt_ids, 12, tok.eos_token_id, bias)
    assert want != argmax_loop(model, prompt_ids, 12, tok.eos_token_id)
    assert result.stdout == "the patient presented" + tok.decode(want, skip_special_tokens=True) + "\n"
    # sampling is adjusted before temperature and top-k: top-k 1 is the adjusted argmax
    sampling = Sampling(max_tokens=12, top_k=1, logit_adjust=2.0)
    sampled = generate(model, tok, "the patient presented", sampling, log_prior=log_prior(np.load(counts)))
    assert sampled == want


@pytest.mark.parametrize("args,message", [
    (["--logit-adjust", "-1"], "--logit-adjust = -1.0 is not allowed (must be in [0, 100] (0 = off))"),
    (["--logit-adjust", "0.5", "--counts", "no/counts.npy"], "no/counts.npy: no such counts file"),
    (["--logit-adjust", "0.5", "--counts", "short.npy"], "expected int64 [%d] for this model's tokenizer"),
    (["--logit-adjust", "0.5"], "data/rare/counts.npy: no such counts file"),  # default: the pipeline's
])
def test_bad_logit_adjust_input_is_one_line(generate_model_dir, tmp_path, args, message):
    np.save(tmp_path / "short.npy", np.ones(7, dtype=np.int64))
    result = run(["rarelm", "generate", "hello", "--model", str(generate_model_dir), *args], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    size = len(load_model_tokenizer(generate_model_dir))
    assert result.stderr.count("\n") == 1 and message.replace("%d", str(size)) in result.stderr, result.stderr

"""The model `train` trains: a GPT-2-style causal LM from scratch, or a pretrained one.

    model = build_model(params.model, data)     # data: rarelm.artifacts.tokenized.TokenizedData

From scratch (`model.name_or_path: ""`) it is transformers' GPT2LMHeadModel sized
by the `model` params, with the tokenizer's vocabulary, its end-of-text id as
bos/eos, PyTorch's scaled-dot-product attention (`ATTENTION`: "sdpa", but in fp32 under bf16
autocast on a CPU) and fused tanh-GELU. With
`model.name_or_path` a local folder or a hub id in the local Hugging Face cache
(`org/name[@revision]`, see rarelm.hub), it is that AutoModelForCausalLM; its
tokenizer must be the one `tokenize` used (same vocabulary), or the token ids
would mean different things to the model and the data. A hub id's commit is
recorded with the run (`provenance`) and is part of the checkpoint key. With
`tokenizer.add_terms` the tokenizer is the model's plus the added term tokens, and the
loaded model gains their rows (rarelm/train/added_embeddings.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rarelm.artifacts.tokenized import TokenizedData
from rarelm.errors import RarelmError
from rarelm.hub import Pretrained, resolve
from rarelm.params import ModelParams
from rarelm.train import lora
from rarelm.train.added_embeddings import init_added_embeddings, read_added

KEY = "model.name_or_path"
ATTENTION = "sdpa_fp32_on_cpu"  # the attention implementation every model trained here runs
WINDOWS = "sdpa_fp32_on_cpu_windows"  # the same on whole windows, with no mask built (for_windows)
# transformers is imported inside the functions: its model classes take ~6 s to import, and the
# stage's launcher imports this module (the checkpoint key's files) without building a model.


def gpt2_config(params: ModelParams, vocab_size: int, eot_id: int):
    from transformers import GPT2Config  # lazy: see the top

    return GPT2Config(
        vocab_size=vocab_size, n_positions=params.block_size, n_embd=params.n_embd,
        n_layer=params.n_layer, n_head=params.n_head, resid_pdrop=params.dropout,
        embd_pdrop=params.dropout, attn_pdrop=params.dropout,
        bos_token_id=eot_id, eos_token_id=eot_id,
        # GPT-2's tanh-approximated GELU as one PyTorch kernel; "gelu_new" computes the same
        # function from five elementwise ops (and saves each for backward).
        activation_function="gelu_pytorch_tanh",
        attn_implementation=attention())


def attention() -> str:
    """`ATTENTION`, registered with transformers: its "sdpa" (PyTorch's scaled_dot_product_attention,
    same masks), except that under bf16 autocast on a CPU the kernel takes query, key and value in
    fp32 and returns bf16. Torch's bf16 attention on CPU is slower than its fp32 one: a forward +
    backward under bf16 autocast ran 1.26x faster with it at the base model's shape, 1.49x at the
    demo's, 1.13x at GPT-2 small's with 8 rows (docs/benchmarks.md). Anywhere else (fp32, CUDA,
    inference without autocast) it is "sdpa" itself, bit for bit. Not saved with the model:
    config.json names no attention, so the saved model loads in plain transformers with its default.
    """
    from transformers import AttentionInterface  # lazy: see the top
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def sdpa_fp32_on_cpu(module, query, key, value, attention_mask, **kwargs):
        if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        with torch.autocast("cpu", enabled=False):
            out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                                  attention_mask, **kwargs)
        return out.to(query.dtype), weights

    AttentionInterface.register(ATTENTION, sdpa_fp32_on_cpu)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    AttentionInterface.register(WINDOWS, sdpa_fp32_on_cpu)  # no mask function: transformers builds none
    return ATTENTION


def for_windows(model, length: int):
    """`model` as training and validation run it, on whole windows of `length` tokens (no padding,
    no cache): attention with no mask, causal by SDPA's `is_causal`. That is how `ATTENTION` already
    runs such windows (transformers drops a causal mask SDPA can apply itself), less the building of
    the mask, whose check for packed sequences reads a tensor on the host every forward: on a GPU
    one sync a step (masking_utils.find_packed_sequence_indices; bench/train_step_profile.py finds
    it). Left as it is where the model's attention is another or needs its mask: a sliding window
    shorter than `length` (Gemma 3's 512 under windows of 1,024), or a layer kind other than full
    and sliding attention.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> tiny = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16,
    ...                                   attn_implementation=attention()))
    >>> for_windows(tiny, 64).config._attn_implementation
    'sdpa_fp32_on_cpu_windows'
    """
    config = model.config
    layer_types = getattr(config, "layer_types", None)  # none: every layer alike (GPT-2, Llama, Mistral)
    kinds, window = set(layer_types or ["full_attention"]), getattr(config, "sliding_window", None)
    sliding = "sliding_attention" in kinds or (window is not None and not layer_types)
    if (config._attn_implementation != ATTENTION or kinds - {"full_attention", "sliding_attention"}
            or (sliding and (window is None or window < length))):
        return model
    model.set_attn_implementation(WINDOWS)
    return model


def build_model(params: ModelParams, data: TokenizedData):
    """A float32 causal LM ready to train, with LoRA adapters if `model.lora.rank` (only they
    train then); random init uses torch's global RNG."""
    if not params.name_or_path:
        from transformers import GPT2LMHeadModel  # lazy: see the top

        return GPT2LMHeadModel(gpt2_config(params, data.vocab_size, data.eot_id))
    return lora.apply(load_pretrained(params, data), params.lora)


def load_pretrained(params: ModelParams, data: TokenizedData):
    """The pretrained causal LM in params.name_or_path (folder or cached hub id), checked against the data."""
    from transformers import AutoModelForCausalLM  # lazy: see the top

    key, name, path = KEY, params.name_or_path, pretrained(params).path
    check_pretrained(params, data)
    from transformers.utils import logging as hf_logging  # lazy: see the top

    hf_logging.disable_progress_bar()  # no "Loading weights" bar per worker in the stage's log
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a refused load is our one line, not its 20-line report
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, attn_implementation=attention())
    except ValueError:  # an architecture without sdpa support: its default attention
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype=torch.float32)
    except Exception as exc:
        why = ("their shapes are not those of config.json" if "ignore_mismatched_sizes" in str(exc)
               else _short(exc))  # (the report it refers to is silenced above)
        raise RarelmError(f"{key}: {name}: cannot load the model weights ({why})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # tokenizer.add_terms: rows for the added term tokens (their sub-tokens' mean), before LoRA
    model = init_added_embeddings(model, read_added(data.root), data.vocab_size)
    rows = model.get_input_embeddings().num_embeddings
    if rows < data.vocab_size:
        raise RarelmError(f"{key}: {name} has {rows} embedding rows, fewer than the "
                          f"tokenizer's {data.vocab_size} tokens")
    return model


def check_pretrained(params: ModelParams, data: TokenizedData) -> None:
    """Refuse, in one line, a pretrained model that every training worker would refuse: no
    loadable config, not a causal LM, another tokenizer, fewer positions than model.block_size,
    safetensors weights whose shapes are not the config's. Reads config, tokenizers and weight
    headers, not the weights: the train launcher runs it once before starting the workers."""
    added = {new for new, _ in read_added(data.root)}  # tokenizer.add_terms: the model gains them
    check_pretrained_with(params, data.tokenizer_dir, "the one tokenize used", added)


def check_pretrained_with(params: ModelParams, tokenizer_dir: Path, tokenizer_name: str,
                          added: set[int] = frozenset()):
    """check_pretrained against the tokenizer in `tokenizer_dir` (`tokenizer_name` says which, in
    the message), token ids in `added` left out; the model's config. The check stage runs it
    before tokenize, with tokenizer.name_or_path's folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: see the top

    key, name, path = KEY, params.name_or_path, pretrained(params).path
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError for bad folders
        raise RarelmError(f"{key}: {name} holds no loadable model config ({_short(exc)})") from None
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise RarelmError(f"{key}: {name} is a {config.model_type!r} model, not a causal LM "
                          "(AutoModelForCausalLM cannot load it)")
    try:
        theirs = AutoTokenizer.from_pretrained(path, local_files_only=True).get_vocab()
    except Exception as exc:
        raise RarelmError(f"{key}: {name} has no loadable tokenizer ({_short(exc)}); the model's "
                          "tokenizer must be the one tokenize used") from None
    ours = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True).get_vocab()
    ours = {token: i for token, i in ours.items() if i not in added}
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()))[:1]
        raise RarelmError(
            f"{key}: {name}'s tokenizer ({len(theirs)} tokens) is not {tokenizer_name} "
            f"({len(ours)} tokens, first difference {differ}); set tokenizer.name_or_path "
            f"to {name} and re-run tokenize")
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None)
    if positions is not None and params.block_size > positions:
        raise RarelmError(f"params: model.block_size = {params.block_size} is not allowed "
                          f"(must be <= {positions}, the positions {name} was trained with)")
    _check_weight_shapes(path, config, name)
    return config


def _check_weight_shapes(path: Path, config, name: str) -> None:
    """Refuse safetensors weights whose shapes differ from what config.json builds (transformers
    would print a report of every tensor, then raise). The model is built on the meta device:
    shapes only, no memory. Other weight formats are left to the load."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM  # lazy: see the top

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(config)
    expected = {k: tuple(v.shape) for k, v in empty.state_dict().items()}
    prefix = f"{empty.base_model_prefix}."  # weights saved from the bare model lack it
    for file in files:
        try:
            with safe_open(str(file), "pt") as weights:
                for tensor in weights.keys():
                    want = expected.get(tensor, expected.get(prefix + tensor))
                    have = tuple(weights.get_slice(tensor).get_shape())
                    if want is not None and have != want:
                        raise RarelmError(
                            f"{KEY}: {name}: its weights do not match its config.json ({tensor} is "
                            f"{list(have)} in {file.name}, {list(want)} by the config); use the "
                            "config the weights were saved with")
        except RarelmError:
            raise
        except Exception as exc:  # a truncated or foreign file
            raise RarelmError(f"{KEY}: {name}: cannot read {file.name} ({_short(exc)})") from None


def pretrained(params: ModelParams) -> Pretrained:
    """Where params.name_or_path's model is: a local folder or a snapshot in the hub cache."""
    return resolve(params.name_or_path, KEY)


def fingerprint_files(params: ModelParams) -> list[Path]:
    """Files whose content identifies the starting model (for the checkpoint key)."""
    if not params.name_or_path:
        return []
    return sorted(p for p in pretrained(params).path.glob("*.json") if p.is_file())


def provenance(params: ModelParams, data: TokenizedData) -> dict[str, str]:
    """The hub commits the run starts from, to record and to key checkpoints by; {} without hub ids.

    {"model_commit": "<sha>", "tokenizer_commit": "<sha>"}: the model's from the cache now,
    the tokenizer's as `tokenize` recorded it in meta.json.
    """
    pinned = {}
    if params.name_or_path and (commit := pretrained(params).commit):
        pinned["model_commit"] = commit
    if commit := data.meta.get("tokenizer_commit"):
        pinned["tokenizer_commit"] = commit
    return pinned


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]

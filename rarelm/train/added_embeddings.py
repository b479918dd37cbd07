"""Terms as tokens, model side: a pretrained model gains a row per added term token, initialised
as the mean of the term's old sub-token rows (the tokenizer side: rarelm/tokenize/added_terms.py).

Fast vocabulary transfer (Gee et al. 2022; Sachidananda et al. 2021 initialise adaptive tokens the
same way): for a new token t whose text the old tokenizer wrote as s_1..s_n,

    E_in[t]  = (1/n) * sum_i E_in[s_i]
    E_out[t] = (1/n) * sum_i E_out[s_i]     (and the output bias, if any), unless tied to E_in

so before any training the new token already points where its pieces did, and its output logit
is the mean of theirs. Runs when the model is loaded, before LoRA or anything else; the training
loop does not know about it.

Worked example (tests/test_terms_as_tokens.py): input rows E[258] = [1, 0], E[260] = [0, 2],
E[262] = [2, 1]; the term " acute mi" = [258, 260, 262] gets E[270] = [1, 1]; untied output
rows [3, 3], [0, 3], [0, 0] give it [1, 2].

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> m = GPT2LMHeadModel(GPT2Config(vocab_size=3, n_positions=4, n_embd=2, n_layer=1, n_head=1))
    >>> _ = m.transformer.wte.weight.data.copy_(torch.tensor([[1., 0.], [0., 2.], [2., 1.]]))
    >>> init_added_embeddings(m, [(3, [0, 1, 2])], 4).transformer.wte.weight[3].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

from pathlib import Path

import torch

from rarelm.errors import RarelmError
from rarelm.files import read_json

ADDED_TERMS = "added_terms.json"  # written by the tokenize stage (rarelm/tokenize/added_terms.py)


def read_added(tokenized_dir: Path) -> list[tuple[int, list[int]]]:
    """(new id, old sub-token ids) per added term token; [] when the tokenizer was not extended."""
    path = Path(tokenized_dir) / ADDED_TERMS
    if not path.is_file():
        return []
    return [(int(r["id"]), [int(i) for i in r["sub_ids"]]) for r in read_json(path)["terms"]]


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return out is None or out.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@torch.no_grad()
def init_added_embeddings(model, added: list[tuple[int, list[int]]], vocab_size: int):
    """Give `model` at least `vocab_size` embedding rows and set each added id's rows (input,
    and output where untied) to the mean of its sub-token rows; returns the model."""
    if not added:
        return model
    rows = model.get_input_embeddings().num_embeddings
    if any(not subs or max(subs) >= min(i for i, _ in added) for _, subs in added):
        raise RarelmError("data/tokenized/added_terms.json: an added token's sub-tokens are not "
                          "older tokens; re-run the tokenize stage")
    if rows < vocab_size:  # a model padded past its tokenizer may already have the rows
        # mean_resizing off: every new row is set below; tied models stay tied
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
    tables = [model.get_input_embeddings()]
    if not _tied(model):
        tables.append(model.get_output_embeddings())
    for table in tables:
        bias = getattr(table, "bias", None)
        for new, subs in added:
            index = torch.tensor(subs, device=table.weight.device)
            table.weight[new] = table.weight.index_select(0, index).mean(0)
            if bias is not None:
                bias[new] = bias.index_select(0, index).mean()
    return model

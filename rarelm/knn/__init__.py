"""kNN-LM and the continuous cache: decode-time memory of the domain's text (docs/knn.md).

- `interpolate`: p_kNN, p_cache and their mix with the model's distribution (the formulas).
- `datastore`: the datastore stage's arrays (train split's final hidden states -> next token),
  built streaming and searched exactly.
- `hook`: the mix plugged into a model's output layer, so `evaluate` and `rarelm generate` read
  it wherever they read the model's next-token distribution.
"""


def needs_store(params) -> bool:
    """Whether evaluate reads the datastore stage's store (`rarelm.params.Params`): the kNN-LM, or
    retrieval by the model's states. The datastore stage builds it and run-plan runs that stage
    for exactly these."""
    return params.knn.enabled or (params.retrieval.enabled and params.retrieval.dense)

"""kNN-LM and the continuous cache: decode-time memory of the domain's text (docs/knn.md).

- `interpolate`: p_kNN, p_cache and their mix with the model's distribution (the formulas).
- `datastore`: the datastore stage's arrays (train split's final hidden states -> next token),
  built streaming and searched exactly.
- `hook`: the mix plugged into a model's output layer, so `evaluate` and `rarelm generate` read
  it wherever they read the model's next-token distribution.
"""

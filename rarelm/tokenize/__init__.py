"""The `tokenize` stage: `tokenization` (train or load the tokenizer, encode every split)."""

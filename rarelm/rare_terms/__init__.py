"""The `rare_terms` stage: token frequency buckets and rare domain terms, and where they occur.

`buckets` (counting, the bucket rule), `segmentation` (words, their roles in a
term, n-grams), `tfidf` (scoring candidates), `glossary` (user and reference
glossaries), `term_search` (finding terms in text and their tokens),
`term_index` (every occurrence in the train split) and `stage` (the whole stage).
What later stages read back is in `rarelm.artifacts`.
"""

"""The `weights` stage: `scoring` (how rare a window's content is, its weight, alpha's schedule)
and `stage` (the whole stage, with what the weights do to exposure)."""

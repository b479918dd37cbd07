"""params.yaml's sections, one frozen dataclass each, and `Params`, the whole file: each field
declares its type, its default and, where it has one, its allowed range or choices (`param`),
checked on load by checks.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from rarelm.errors import RarelmError
from rarelm.params.checks import SEED_MAX, build, param, shown


@dataclasses.dataclass(frozen=True)
class CorpusParams:
    """Where the raw corpus is and how `prepare` cleans and splits it."""

    path: str = "data/raw/demo_en.txt.gz"  # file or folder of .txt/.jsonl/.csv/.parquet (+ .gz)
    format: Literal["auto", "txt", "jsonl", "csv", "parquet"] = "auto"  # auto: by file suffix
    language: Literal["en", "zh", "auto"] = "en"
    txt_documents: Literal["line", "blank_line"] = "line"  # how a .txt file separates documents
    text_field: str = "text"  # column / key holding the text in jsonl, csv and parquet
    encoding_errors: Literal["strict", "replace"] = "strict"  # invalid UTF-8: stop, or use U+FFFD
    dedup: bool = True  # drop exact duplicate documents (after cleaning)
    min_chars: int = param(1, ge=1)  # documents shorter than this after cleaning are dropped
    # longest line read (and document: a blank_line paragraph, a csv field), in bytes; a longer one
    # is refused before it is read whole, so memory stays bounded by it (a gzip bomb of one line)
    max_line_bytes: int = param(16_777_216, ge=1024, le=2**31 - 1)
    val_fraction: float = param(0.1, ge=0.0, lt=1.0)
    test_fraction: float = param(0.1, ge=0.0, lt=1.0)
    # the document split depends on this seed alone, so replicates that vary the top-level `seed`
    # (initialisation, sampling) are evaluated on the same test documents, occurrence by occurrence
    split_seed: int = param(1337, ge=0, le=SEED_MAX)
    reference_glossary: str = "data/raw/demo_en.glossary.tsv"  # ground truth for term extraction; "" = none
    # jsonl key / csv or parquet column naming each document's group (a man page, a book, a
    # patient): the split then hashes the group, so a group is never split across train/val/test;
    # "" = none, every document split by its own text (rarelm/prepare/corpus.py)
    group_field: str = ""


@dataclasses.dataclass(frozen=True)
class TokenizerParams:
    """The tokenizer `tokenize` trains (byte-level BPE) or loads (a folder or cached hub id)."""

    # "" trains a BPE tokenizer on the train split; else a local folder or a hub id org/name[@rev]
    # already in the Hugging Face cache (rarelm/hub.py; never downloaded)
    name_or_path: str = ""
    vocab_size: int = param(4096, ge=260, le=1_000_000)
    min_frequency: int = param(2, ge=1)
    batch_size: int = param(2000, ge=1)  # documents encoded per batch (bounds memory)
    # Han characters: "chars" makes each one its own pre-token, so no token crosses a Chinese word
    # boundary; "merge" lets byte-level BPE merge runs of characters (fewer tokens, but a term's
    # characters then share tokens with their neighbours). No effect on text without Han characters.
    cjk: Literal["chars", "merge"] = "chars"
    # terms as tokens: the domain's term list (rare.* params, as rare_terms builds it) joins the
    # tokenizer as whole tokens, the data is encoded with it, and a pretrained model's new rows
    # start as the mean of each term's old sub-token rows (rarelm/tokenize/added_terms.py)
    add_terms: bool = False
    add_terms_max: int = param(1000, ge=1)  # at most this many terms added, in term-list order


@dataclasses.dataclass(frozen=True)
class RareParams:
    """Frequency buckets and rare-term extraction (`rare_terms`; rules in rarelm/rare_terms/)."""

    frequent_share: float = param(0.8, gt=0.0, lt=1.0)  # frequent tokens cover >= this share
    rare_share: float = param(0.05, gt=0.0, lt=1.0)  # rare tokens cover <= this share
    ngram_max: int = param(5, ge=1, le=8)  # longest term, in words (jieba words for Chinese)
    min_df: int = param(1, ge=1)  # a term occurs in at least this many training documents
    max_df: float = param(0.1, gt=0.0, le=1.0)  # ... and in at most this fraction of them
    min_count: int = param(2, ge=1)  # ... and at least this many times in all
    min_mean_tf: float = param(1.5, ge=1.0, le=1e6)  # ... and this many times per document having it
    top_k: int = param(1000, ge=1)  # at most this many TF-IDF terms, best score first
    max_documents: int = param(10_000, ge=1)  # TF-IDF on at most this many (evenly spread) documents
    glossary: str = ""  # optional user glossary, one term per line (UTF-8); always kept
    tfidf: bool = True  # also extract TF-IDF terms; false: the glossary's terms only (needs glossary)
    # Chinese corpora: a TF-IDF candidate whose string sits inside longer words in more than this
    # share of its matches in the TF-IDF documents is a fragment ("arg" of "argument", 括号 of
    # 圆括号): skipped; 1 = off (rarelm/rare_terms/quality.py; English keeps "api" beside "APIs")
    max_inside_share: float = param(0.1, ge=0.0, le=1.0)
    chunk_tokens: int = param(4_000_000, ge=1024)  # tokens counted per chunk (bounds memory)
    # TF-IDF also sees the val and test documents (train counts stay train-only), so terms that the
    # train split never holds can be tested (the "seen 0-1" stratum); false: train documents only
    tfidf_all_splits: bool = False

    def __post_init__(self) -> None:
        if not self.tfidf and not self.glossary:
            raise RarelmError("rare.tfidf: false leaves no term without a rare.glossary; "
                              "set rare.glossary or rare.tfidf: true")


@dataclasses.dataclass(frozen=True)
class WeightsParams:
    """How `weights` turns token frequencies into per-sample weights (rarelm/weights/scoring.py)."""

    # frequency: mean inverse token frequency of the window's targets; terms: the rarity of the
    # extracted terms the window holds (sum of 1 / train_count ** term_beta, plus term_floor)
    score: Literal["frequency", "terms"] = "frequency"
    term_beta: float = param(1.0, ge=0.0, le=100.0)  # terms: how much more a rarer term counts
    term_floor: float = param(0.05, gt=0.0, le=1e6)  # terms: the score of a window without a term
    # alpha over training: constant; decay (alpha -> 0, linearly over the epochs); grow (0 -> alpha)
    schedule: Literal["constant", "decay", "grow"] = "constant"
    # training windows start at a new offset each epoch (0 in the first), so no two neighbouring
    # tokens are split by a window edge in every epoch; false: always at multiples of block_size
    shift_windows: bool = True
    clip_ratio: float = param(100.0, ge=1.0, le=1e12)  # largest / smallest weight after clipping
    chunk_tokens: int = param(4_000_000, ge=1024)  # tokens scored per chunk (bounds memory)


@dataclasses.dataclass(frozen=True)
class LossParams:
    """Target weighting: weight 1 + rare_weight on the targets that `targets` selects."""

    rare_weight: float = param(0.0, ge=0.0, le=1e4)
    # rare_bucket: targets in the rare frequency bucket; terms: tokens of term occurrences; both;
    # terms_after_first: the tokens of a term occurrence after its first (rarelm/objectives/selection.py)
    targets: Literal["rare_bucket", "terms", "both", "terms_after_first"] = "rare_bucket"
    # per-vocabulary target weight from frequency (rarelm/objectives/): uniform (none); token-level
    # adaptive training's exponential / chi-square forms; FACE (frequency-aware cross-entropy)
    token_weight: Literal["uniform", "tlat_exp", "tlat_chi2", "face"] = "uniform"
    tlat_a: float = param(1.0, ge=0.0, le=1e4)  # TLAT: weight 1 + A * f(count)
    tlat_t: float = param(1.75, gt=0.0, le=1e4)  # TLAT: temperature T of f(count)
    face_source: Literal["targets", "predictions"] = "targets"  # FACE: frequencies counted from
    face_refresh: int = param(100, ge=1)  # FACE: steps between weight refreshes
    focal_gamma: float = param(0.0, ge=0.0, le=100.0)  # focal loss (1 - p_t)^gamma; 0 = off
    logit_adjust_tau: float = param(0.0, ge=0.0, le=100.0)  # loss on logits + tau * log prior; 0 = off
    agg: bool = False  # adaptive gradient gating of rare tokens' output embeddings
    agg_alpha: float = param(0.03, gt=0.0, le=1.0)  # AGG: rare = in-batch appearance rate below this
    # token-level unlikelihood (Welleck et al. 2020) at every target: negatives = previous context
    unlikelihood: float = param(0.0, ge=0.0, le=1e4)
    # the repo's earlier variant: frequent-bucket tokens ranked above the target, at the selected targets
    frequent_unlikelihood: float = param(0.0, ge=0.0, le=1e4)
    # KL(base || model) on the targets `targets` does not select, to the frozen starting model
    kl_base: float = param(0.0, ge=0.0, le=1e4)
    # the weighted loss over: weights = sum of the weights | targets = their number (the unselected
    # targets keep their plain-CE share whatever rare_weight is)
    normalize: Literal["weights", "targets"] = "weights"


@dataclasses.dataclass(frozen=True)
class LoraParams:
    """LoRA adapters on a pretrained model (rarelm/train/lora.py, through `peft`); rank 0 = off."""

    rank: int = param(0, ge=0)  # 0 = full fine-tuning; r of the low-rank update B A
    alpha: float = param(16.0, gt=0.0, le=1e6)  # the update is scaled by alpha / rank
    dropout: float = param(0.0, ge=0.0, lt=1.0)  # dropout on the adapters' input
    # module names (suffixes) to adapt; [] = peft's default for the architecture (GPT-2: c_attn)
    target_modules: list[str] = param([])


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """A GPT-2-style model from scratch, or a pretrained causal LM (folder or cached hub id)."""

    name_or_path: str = ""  # "" builds a GPT-2-style model from the sizes below; else as tokenizer
    n_layer: int = param(4, ge=1)
    n_head: int = param(4, ge=1)
    n_embd: int = param(128, ge=8)
    block_size: int = param(128, ge=8)
    dropout: float = param(0.0, ge=0.0, lt=1.0)
    # the weights as stored in models/model (training runs in train.precision): float16 halves
    # the folder; config.json keeps float32, so loaders upcast (the committed base/model is float16)
    save_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    lora: LoraParams = dataclasses.field(default_factory=LoraParams)


@dataclasses.dataclass(frozen=True)
class TrainParams:
    """The training loop (`train`)."""

    nproc: int = param(2, ge=1)
    # ddp: every rank holds the whole model and optimizer; fsdp: FSDP2 shards parameters,
    # gradients and optimizer state over the ranks (needs >= 2 ranks; docs/multinode.md)
    strategy: Literal["ddp", "fsdp"] = "ddp"
    max_steps: int = param(1000, ge=0)  # 0: no step, the starting (pretrained) model saved as is
    batch_size: int = param(16, ge=1)  # micro-batch per process
    grad_accum: int = param(1, ge=1)
    lr: float = param(3e-3, gt=0.0, le=10.0)
    min_lr: float = param(3e-4, ge=0.0, le=10.0)
    warmup_steps: int = param(10, ge=0)
    weight_decay: float = param(0.1, ge=0.0, le=100.0)
    grad_clip: float = param(1.0, ge=0.0, le=1e9)  # 0 disables clipping
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # bf16 if native, faster: train/precision.py
    gradient_checkpointing: bool = False
    compile: bool = False
    log_every: int = param(10, ge=1)
    eval_every: int = param(100, ge=1)
    eval_batches: int = param(8, ge=1)  # val batches of batch_size per evaluation
    checkpoint_every: int = param(100, ge=1)
    max_restarts: int = param(0, ge=0)
    # stop after this many validations (every eval_every steps) without a lower val_ce; 0 = off
    early_stop_patience: int = param(0, ge=0)
    keep_best: bool = False  # save the weights of the validation with the lowest val_ce, not the last
    # general-text replay (rarelm/train/replay.py): floor(replay_share * batch_size + 1/2) rows of every
    # micro-batch are windows of replay_text (one document a line; data/general/<lang>.replay.txt is
    # text the base model trained on); 0 = off, the plain pipeline bit for bit
    replay_share: float = param(0.0, ge=0.0, lt=1.0)
    replay_text: str = ""

    def __post_init__(self) -> None:
        if not self.replay_share:
            return
        if not self.replay_text:
            raise RarelmError(f"params: train.replay_text = '' is not allowed with train.replay_share = "
                              f"{self.replay_share:g} (must name a text file, e.g. "
                              "data/general/en.replay.txt)")
        rows = int(math.floor(self.replay_share * self.batch_size + 0.5))  # replay.replay_rows
        if not 1 <= rows < self.batch_size:
            raise RarelmError(
                f"params: train.replay_share = {self.replay_share:g} is not allowed with train.batch_size = "
                f"{self.batch_size} (gives {rows} replay rows of {self.batch_size}: must give at least "
                "one replay row and at least one domain row)")


@dataclasses.dataclass(frozen=True)
class EvalParams:
    """What `evaluate` measures (see rarelm/evaluate/)."""

    splits: list[str] = param(["test"])  # the first is metrics/eval.json's top level, others nest
    block_size: int = param(0, ge=0)  # scoring window in tokens; 0 = the model's context length
    batch_size: int = param(32, ge=1)  # windows / prompts per forward pass
    max_terms: int = param(2000, ge=1)  # most term occurrences generated (round robin over terms)
    # which occurrences the max_terms cap keeps: terms = round robin over terms (every term its turn,
    # the rarest not crowded out); occurrences = drawn over all occurrences alike (a term as often as
    # the text holds it; the sample's repeat share about the text's)
    term_sample: Literal["terms", "occurrences"] = "terms"
    # most tokens scored for perplexity, of the split and of general_text each, in windows spread
    # evenly; 0 = all (a budget for big models on a CPU: n_eval_tokens, n_general_tokens say what was)
    max_tokens: int = param(0, ge=0)
    closed_set: bool = True  # also rank the true term among all extracted terms by NLL
    context_tokens: int = param(64, ge=1)  # prompt: up to this many tokens before the term
    diversity_prompts: int = param(64, ge=0)  # free continuations sampled; 0 = skip
    diversity_tokens: int = param(64, ge=1)  # tokens per continuation
    # false insertion: sampled continuations in which extracted terms are counted; 0 = skip
    insertion_prompts: int = param(128, ge=0)
    insertion_tokens: int = param(64, ge=1)  # tokens per continuation
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # CPU threads for evaluation; 0 = torch's default (all cores). Scoring a small model is a stream
    # of tiny forward passes, which threads only slow down, badly so on a CPU shared with other jobs
    threads: int = param(1, ge=0)
    # post-hoc logit adjustment: logits - tau * log prior (train unigram) wherever the model's
    # next-token distribution is used (scores, generation); 0 = the model as trained
    logit_adjust_tau: float = param(0.0, ge=0.0, le=100.0)
    # general text held out from the base model's pretraining (one document a line) scored as
    # `ppl_general_model` (the model alone: the forgetting guard) and `ppl_general` (with decode-time
    # mixing, if on); auto = data/general/<corpus language>.txt where it exists (en, zh); "" = off
    general_text: str = "auto"
    # general text from outside the base's pretraining family (one document a line), scored by the
    # model alone as `ppl_general_outside`: forgetting where general_text is the base's own kind of
    # text; auto = data/general/<corpus language>.outside.txt where it exists (en, zh); "" = off
    general_text_outside: str = "auto"
    # term-trie constrained decoding (rarelm/evaluate/term_trie.py): once the text ends inside a term,
    # generation continues it; generation metrics only, teacher-forced scores unchanged
    term_trie: bool = False
    # the trie's gate: a step is constrained only where the distribution being decoded puts at least
    # this probability on the term's continuations (0 = every step inside a term); needs term_trie
    term_trie_min_mass: float = param(0.0, ge=0.0, lt=1.0)

    def __post_init__(self) -> None:
        if self.term_trie_min_mass and not self.term_trie:
            raise RarelmError(f"params: eval.term_trie_min_mass = {self.term_trie_min_mass} gates the term "
                              "trie, which is off (set eval.term_trie: true)")
        allowed = ("train", "val", "test")
        if not self.splits or len(set(self.splits)) != len(self.splits) or \
                any(s not in allowed for s in self.splits):
            raise RarelmError(f"params: eval.splits = {self.splits!r} is not allowed "
                              f"(must be a non-empty list of distinct splits from {', '.join(allowed)})")


@dataclasses.dataclass(frozen=True)
class KnnParams:
    """kNN-LM and the continuous cache at decode time (rarelm/knn/, docs/knn.md); off by default.

    p = (1 - weight - cache_weight) p_LM + weight p_kNN + cache_weight p_cache. Choose weight and the
    temperatures on val, never on test. The two parts switch on apart: kNN-LM with `enabled` (the
    datastore stage builds its store), the cache with cache_window and cache_weight > 0 (no store).
    """

    enabled: bool = False  # kNN-LM: build the datastore and mix it with `weight`; false: no kNN part
    k: int = param(16, ge=1, le=4096)  # nearest datastore entries that vote
    weight: float = param(0.25, ge=0.0, le=1.0)  # lambda of kNN-LM (> 0 when enabled)
    temperature: float = param(1.0, gt=0.0, le=1e6)  # of exp(-squared L2 distance / T), or exp(cos / T)
    # l2: -||q - k||^2 (grows with the hidden width and the states' norms, as the cache's dot);
    # cosine: cos(q, k) in [-1, 1] (keys stored unit-length), units any model shares
    similarity: Literal["l2", "cosine"] = "l2"
    cache_window: int = param(0, ge=0, le=100_000)  # earlier positions of the document; 0 = no cache
    cache_weight: float = param(0.0, ge=0.0, le=1.0)  # lambda of the continuous cache
    cache_temperature: float = param(1.0, gt=0.0, le=1e6)  # of exp(h_t . h_i / T)
    # dot: h_t . h_i (grows with the hidden width and the states' norms: a temperature chosen on one
    # model means nothing on another); cosine: cos(h_t, h_i) in [-1, 1], units any model shares
    cache_similarity: Literal["dot", "cosine"] = "dot"
    max_entries: int = param(0, ge=0)  # datastore entries from the train split's start; 0 = all
    key_dtype: Literal["float16", "float32"] = "float16"  # stored keys (float16: half the disk)
    # exact: torch, every key per query; ivf: a faiss IndexIVFFlat built by the datastore stage, which
    # searches nprobe of its nlist clusters (25-47x faster at 100k-1M entries, docs/benchmarks.md)
    index: Literal["exact", "ivf"] = "exact"
    nlist: int = param(0, ge=0, le=1_000_000)  # IVF clusters; 0 = 4 sqrt(entries)
    # IVF clusters searched per query (more: closer to exact); 32 found 98% of the exact 16 neighbours
    # on base/model's hidden states, 8 found 85% (docs/benchmarks.md)
    nprobe: int = param(32, ge=1, le=1_000_000)
    # gates on kNN-LM's lambda per position (rarelm/knn/interpolate.py `gated`), 0 = off: full weight
    # only where the nearest key's cosine reaches 1, none at or below gate_cosine (cosine stores) ...
    gate_cosine: float = param(0.0, ge=0.0, lt=1.0)
    # ... and full weight only where the model's own next-token entropy reaches gate_entropy nats
    gate_entropy: float = param(0.0, ge=0.0, le=100.0)

    def __post_init__(self) -> None:
        if self.gate_cosine and self.similarity != "cosine":
            raise RarelmError(f"params: knn.gate_cosine = {self.gate_cosine:g} with knn.similarity = "
                              f"{self.similarity} is not allowed (the gate reads cosines: set "
                              "knn.similarity cosine)")
        gate = "knn.gate_cosine" if self.gate_cosine else "knn.gate_entropy" if self.gate_entropy else ""
        if gate and not self.enabled:
            raise RarelmError(f"params: {gate} = {self.gate_cosine or self.gate_entropy:g} with "
                              "knn.enabled = false is not allowed (the gates act on kNN-LM's weight; the "
                              "cache has none)")
        if self.enabled and self.weight == 0:
            raise RarelmError("params: knn.enabled = true with knn.weight = 0 is not allowed (it builds a "
                              "datastore nothing reads; the cache alone needs knn.enabled false)")
        if self.enabled and self.weight + self.cache_weight > 1.0:
            raise RarelmError(f"params: knn.weight + knn.cache_weight = {self.weight + self.cache_weight:g} "
                              "is not allowed (must be <= 1)")


@dataclasses.dataclass(frozen=True)
class RetrievalParams:
    """In-context retrieval at decode time (rarelm/evaluate/retrieval.py); off by default: BM25 over
    the train split's passages, the best put before every prompt and scored window."""

    enabled: bool = False
    passages: int = param(1, ge=1, le=16)  # passages put before each prompt, the best last
    passage_tokens: int = param(64, ge=8, le=4096)  # the train split cut into passages of this length
    query_tokens: int = param(32, ge=1, le=4096)  # the query: the text of this many tokens before
    max_passages: int = param(0, ge=0)  # passages from the train split's start; 0 = all
    # the control: as many train passages drawn at random (seeded by `seed`), the query ignored; what
    # in-domain text in front gives by itself, beside what the right passage gives
    random: bool = False
    # by the model's own states instead of BM25: the passage after each of the datastore keys nearest
    # the model's state at the query's end (the datastore stage builds the store; knn.similarity)
    dense: bool = False

    def __post_init__(self) -> None:
        if self.random and self.dense:
            raise RarelmError("params: retrieval.random = true is not allowed with retrieval.dense = true "
                              "(the control draws at random, dense finds passages by the model's states)")


@dataclasses.dataclass(frozen=True)
class TrackingParams:
    """MLflow tracking; the store is MLFLOW_TRACKING_URI or sqlite:///<repo>/mlflow.db."""

    experiment: str = "rarelm"
    system_metrics: bool = True
    # log the trained model (a text-generation pyfunc, rarelm/tracking/serving.py):
    # auto = only models under 2 GB of weights; true / false = always / never
    log_model: Literal["auto", "true", "false"] = "auto"
    registered_model: str = "rarelm"  # registry name for `rarelm register` (and for `register`)
    register: bool = False  # register every trained model; false: only by `rarelm register`
    tensorboard: bool = False  # also write TensorBoard event files (runs/<run name>/)
    # a store that cannot log fails the stage (one line, before any output is written); false =
    # one warning and the stage goes on untracked. On: an untracked run in a sweep is a lost
    # comparison that DVC would report as a success
    required: bool = True
    # test-corpus text (evaluate's per-occurrence rows: expected terms, generated continuations)
    # as MLflow artifacts: auto = only into a store on this machine (sqlite:, file:), true / false
    log_text: Literal["auto", "true", "false"] = "auto"

    def __post_init__(self) -> None:
        name = self.experiment
        if not name.strip() or len(name) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise RarelmError(f"params: tracking.experiment = {shown(name)} is not allowed (must be 1 "
                              "to 256 characters, not only spaces, without control characters)")


@dataclasses.dataclass(frozen=True)
class Params:
    """All of params.yaml."""

    seed: int = param(1337, ge=0, le=SEED_MAX)
    alpha: float = param(0.0, ge=0.0, le=100.0)  # sampler reweighting strength; 0 = uniform
    corpus: CorpusParams = dataclasses.field(default_factory=CorpusParams)
    tokenizer: TokenizerParams = dataclasses.field(default_factory=TokenizerParams)
    rare: RareParams = dataclasses.field(default_factory=RareParams)
    weights: WeightsParams = dataclasses.field(default_factory=WeightsParams)
    loss: LossParams = dataclasses.field(default_factory=LossParams)
    model: ModelParams = dataclasses.field(default_factory=ModelParams)
    train: TrainParams = dataclasses.field(default_factory=TrainParams)
    eval: EvalParams = dataclasses.field(default_factory=EvalParams)
    knn: KnnParams = dataclasses.field(default_factory=KnnParams)
    retrieval: RetrievalParams = dataclasses.field(default_factory=RetrievalParams)
    tracking: TrackingParams = dataclasses.field(default_factory=TrackingParams)

    def __post_init__(self) -> None:
        c = self.corpus
        if c.val_fraction + c.test_fraction >= 1.0:
            raise RarelmError(
                f"params: corpus.val_fraction + corpus.test_fraction = "
                f"{c.val_fraction + c.test_fraction:g} is not allowed (must be < 1)")
        if self.rare.rare_share + self.rare.frequent_share >= 1.0:
            raise RarelmError(
                f"params: rare.frequent_share + rare.rare_share = "
                f"{self.rare.frequent_share + self.rare.rare_share:g} is not allowed "
                "(must be < 1, or the medium bucket is empty)")
        if self.model.lora.rank and not self.model.name_or_path:
            raise RarelmError(
                f"params: model.lora.rank = {self.model.lora.rank} is not allowed without a "
                "pretrained model (set model.name_or_path, or model.lora.rank: 0)")
        if self.model.lora.rank and self.loss.agg:
            raise RarelmError("params: loss.agg = true is not allowed with model.lora (AGG gates "
                              "the output layer's gradient, and LoRA freezes that layer)")
        if self.model.n_embd % self.model.n_head:
            raise RarelmError(
                f"params: model.n_embd = {self.model.n_embd} is not allowed "
                f"(must be divisible by model.n_head = {self.model.n_head})")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Params:
        return build(cls, raw, "")

    def flat(self) -> dict[str, Any]:
        """Every param as a flat dict: {"alpha": 0.0, "train.lr": 0.003, ...}."""
        out: dict[str, Any] = {}

        def walk(obj: Any, prefix: str) -> None:
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if dataclasses.is_dataclass(value):
                    walk(value, f"{prefix}{f.name}.")
                else:
                    out[prefix + f.name] = value

        walk(self, "")
        return out

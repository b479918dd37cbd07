"""The kNN-LM datastore: (final hidden state at position t, token t+1) over the train split.

The `datastore` stage writes, in data/datastore/:

    keys.npy     float16 or float32 [entries, hidden], memory-mapped (np.load(mmap_mode="r"))
    values.npy   int32 [entries]: the token that followed each key
    meta.json    entries, hidden, key dtype, block size, similarity (a store of another model is
                 caught by its key width only: DVC rebuilds the stage when models/model changes)

or, with knn.enabled false, meta.json alone with `"enabled": false` (DVC needs an output).

The train split is cut into the same non-overlapping windows as evaluate's scoring
(every token after the first is a target once), `batch_size` windows per forward; keys are
written straight into the preallocated memory-mapped arrays, so memory is one batch's
hidden states whatever the split's size. `max_entries` > 0 keeps the first that many
targets.

Search is exact by default: squared L2 distances ||q||^2 - 2 q.k + ||k||^2 against `CHUNK`
keys at a time (one matmul), a running top-k merged per chunk; its cost is entries x hidden
multiply-adds per query. With knn.index ivf the stage also writes keys.ivf, a faiss
IndexIVFFlat, and search looks in the `nprobe` clusters nearest to the query only
(docs/knn.md, bench/knn.py, docs/benchmarks.md). With knn.similarity cosine the keys are stored
unit-length and each query is made unit-length before the search, so the distance is
||q/|q| - k/|k| ||^2 = 2 - 2 cos(q, k), whatever the model's width or its states' norms:

    store = Datastore.open("data/datastore")
    distances, values = store.search(queries, k=8)     # [n, 8] each, nearest first

`NearestStates` searches the same store for in-context retrieval (retrieval.dense): the passages
that followed the keys nearest the model's state at a query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from rarelm.errors import RarelmError
from rarelm.files import read_json

CHUNK = 65536  # keys per matmul: 64k x 256 float32 = 64 MB, bounded whatever the store's size


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """The hidden states the output layer reads (after the final norm): [batch, positions, hidden].

    The lm_head's own input, caught by a hook, so it is the same vector for any architecture
    (GPT-2's ln_f output, Llama's norm output) as the query that rarelm.knn.hook sees.
    """
    seen = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        handle.remove()
    return seen[-1]


def build(model, tokens: np.ndarray, block_size: int, batch_size: int, out: Path, key_dtype: str = "float16",
          max_entries: int = 0, progress: Callable[[int], None] | None = None, index: str = "exact",
          nlist: int = 0, similarity: str = "l2", lead: Sequence[int] = ()) -> dict:
    """Write keys.npy, values.npy and meta.json into the folder `out`; returns meta.

    Targets 1..n-1 of `tokens` in windows of `block_size` (the last one shorter), capped at
    `max_entries` (0 = all); `progress(n)` after each batch with the entries written; keys
    unit-length with `similarity` "cosine". `lead` (the model's `<bos>`) goes before every window,
    as evaluate puts it (rarelm/evaluate/prefix.py), and gives no entry.
    """
    n = max(len(tokens) - 1, 0)
    if max_entries:
        n = min(n, max_entries)
    hidden = _hidden_size(model)
    keys = np.lib.format.open_memmap(out / "keys.npy", mode="w+", dtype=np.dtype(key_dtype),
                                     shape=(n, hidden))
    values = np.lib.format.open_memmap(out / "values.npy", mode="w+", dtype=np.int32, shape=(n,))
    starts = np.arange(0, n, block_size)
    for b in range(0, len(starts), batch_size):
        batch = starts[b:b + batch_size]
        lengths = np.minimum(block_size, n - batch)  # only the last window is shorter
        for length in np.unique(lengths):
            first = batch[lengths == length]
            rows = np.stack([tokens[s:s + length + 1] for s in first]).astype(np.int64)
            head = np.tile(np.asarray(lead, np.int64), (len(rows), 1))
            inputs = np.concatenate([head, rows[:, :-1]], axis=1)
            states = final_hidden(model, torch.as_tensor(inputs, device=model.device))[:, len(lead):].float()
            if similarity == "cosine":
                states = torch.nn.functional.normalize(states, dim=-1)
            states = states.cpu().numpy().astype(key_dtype)
            for row, s in enumerate(first):
                keys[s:s + length] = states[row]
                values[s:s + length] = rows[row, 1:]
        if progress:
            progress(int(lengths.sum()))
    keys.flush()
    values.flush()
    del keys, values
    meta = {"enabled": True, "entries": int(n), "hidden": hidden, "key_dtype": key_dtype,
            "block_size": int(block_size), "index": index, "similarity": similarity,
            "lead": [int(t) for t in lead]}
    if index == "ivf" and n:
        meta["nlist"] = build_ivf(np.load(out / "keys.npy", mmap_mode="r"), out / IVF_FILE, nlist)
    return meta


IVF_FILE = "keys.ivf"


def build_ivf(keys: np.ndarray, path: Path, nlist: int = 0) -> int:
    """A faiss IndexIVFFlat over `keys`, written to `path`; returns its nlist (0: 4 sqrt(entries)).

    k-means is trained on at most 64 points a cluster, taken evenly spaced (deterministic), with
    faiss's fixed seed; the keys are added in `CHUNK`s. The index holds every key as float32 in
    memory when searched (4 x hidden bytes an entry).
    """
    import faiss  # on use: knn.index ivf only

    n, d = keys.shape
    nlist = min(nlist or max(1, int(4 * np.sqrt(n))), n)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
    sample = np.linspace(0, n - 1, min(n, 64 * nlist)).astype(np.int64)
    ivf.train(np.asarray(keys[sample], dtype=np.float32))
    for start in range(0, n, CHUNK):
        ivf.add(np.asarray(keys[start:start + CHUNK], dtype=np.float32))
    faiss.write_index(ivf, str(path))
    return nlist


def _hidden_size(model) -> int:
    layer = model.get_output_embeddings()
    return int(layer.weight.shape[1])


@dataclasses.dataclass
class Datastore:
    """An opened datastore: memory-mapped keys and values, searched exactly in `CHUNK`s."""

    keys: np.ndarray  # [entries, hidden] float16/float32, memory-mapped
    values: torch.Tensor  # [entries] int64
    device: str = "cpu"
    ivf: object | None = None  # a faiss IndexIVFFlat (knn.index ivf), else exact search
    nprobe: int = 32  # IVF clusters searched per query (knn.nprobe)
    similarity: str = "l2"  # cosine: unit-length keys, and queries made so before the search

    @classmethod
    def open(cls, folder: str | Path, device: str = "cpu", nprobe: int = 32) -> Datastore:
        folder = Path(folder)
        try:
            meta = read_json(folder / "meta.json")
        except FileNotFoundError:
            raise RarelmError(f"{folder}: no meta.json; run the datastore stage first "
                              "(dvc repro datastore)") from None
        if not meta.get("enabled"):
            raise RarelmError(f"{folder}: the datastore was built with knn.enabled and retrieval.dense false "
                              "(an empty marker); re-run the datastore stage with either true")
        keys = np.load(folder / "keys.npy", mmap_mode="r")
        values = np.load(folder / "values.npy")
        if keys.shape != (meta["entries"], meta["hidden"]) or values.shape != (meta["entries"],):
            raise RarelmError(f"{folder}: keys {keys.shape} / values {values.shape} do not match meta.json "
                              f"({meta['entries']} entries of {meta['hidden']}); re-run the datastore stage")
        ivf = None
        if meta.get("index") == "ivf" and meta["entries"]:
            import faiss  # on use: knn.index ivf only

            ivf = faiss.read_index(str(folder / IVF_FILE))
        return cls(keys, torch.as_tensor(values.astype(np.int64)), device, ivf, nprobe,
                   meta.get("similarity", "l2"))  # a store from before knn.similarity: l2

    def __len__(self) -> int:
        return len(self.values)

    @property
    def hidden(self) -> int:
        return int(self.keys.shape[1])

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(squared L2 distances, values) of each query's k nearest keys, [n, min(k, entries)] each,
        nearest first; ties keep the earlier entry. A cosine store: distances 2 - 2 cos, in [0, 4]."""
        distances, entries = self.nearest(queries, k)
        return distances, self.values.to(distances.device)[entries.clamp_min(0)]

    def nearest(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(squared L2 distances, entry indices) of each query's k nearest keys, as `search`; entry e
        is the state after train token e (its value: token e + 1). With the IVF index, a neighbour it
        did not find has distance inf and index -1."""
        queries = queries.float().reshape(-1, queries.shape[-1])
        if self.similarity == "cosine":
            queries = torch.nn.functional.normalize(queries, dim=-1)
        k = min(k, len(self))
        if self.ivf is not None:
            return self._search_ivf(queries, k)
        best_d = torch.empty((len(queries), 0), device=queries.device)
        best_i = torch.empty((len(queries), 0), dtype=torch.long, device=queries.device)
        norms = self._key_norms(queries.device)
        for start in range(0, len(self), CHUNK):
            chunk = self._chunk(start, queries.device)
            # ||k||^2 - 2 q.k in one fused matmul: ||q||^2 is the same for every key of a query, so it
            # is added to the k kept alone (half the time of the three-term sum, bench/knn.py)
            d = torch.addmm(norms[None, start:start + len(chunk)], queries, chunk.T, alpha=-2)
            top = d.topk(min(k, d.shape[1]), dim=-1, largest=False, sorted=True)
            cand_d = torch.cat([best_d, top.values], 1)
            cand_i = torch.cat([best_i, top.indices + start], 1)
            # stable sort: an equal distance keeps the earlier chunk's (the earlier entry's) place
            order = cand_d.argsort(dim=-1, stable=True)[:, :k]
            best_d, best_i = cand_d.gather(1, order), cand_i.gather(1, order)
        distances = (best_d + (queries * queries).sum(-1, keepdim=True)).clamp_min(0)  # rounding: not < 0
        return distances, best_i

    def _search_ivf(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The IVF index's k nearest among its `nprobe` nearest clusters; a neighbour it did not find
        (fewer than k keys in those clusters) has distance inf (so it gets no vote) and index -1."""
        self.ivf.nprobe = self.nprobe
        distances, ids = self.ivf.search(queries.detach().cpu().numpy(), k)
        found = torch.as_tensor(ids >= 0)
        distances = torch.where(found, torch.as_tensor(distances), torch.full(found.shape, float("inf")))
        return distances.to(queries.device), torch.as_tensor(ids, dtype=torch.long).to(queries.device)

    def _chunk(self, start: int, device) -> torch.Tensor:
        # a copy of the slice: torch warns on a read-only memory map, and float() copies again anyway
        return torch.from_numpy(np.array(self.keys[start:start + CHUNK])).to(device).float()

    def _key_norms(self, device) -> torch.Tensor:
        """||key||^2 of every entry, float32, computed once per opened store (4 bytes an entry)."""
        if getattr(self, "_norms", None) is None:
            self._norms = torch.cat([(c * c).sum(-1) for c in
                                     (self._chunk(s, device) for s in range(0, len(self), CHUNK))]) \
                if len(self) else torch.zeros(0, device=device)
        return self._norms.to(device)


class NearestStates:
    """In-context retrieval by the model's states (retrieval.dense, rarelm/evaluate/retrieval.py): where
    in the train split the model was in a state like the query's, and the passage that followed."""

    def __init__(self, model, store: Datastore, tokens: np.ndarray, lead: Sequence[int] = ()):
        self.model, self.store, self.tokens, self.lead = model, store, np.asarray(tokens), list(lead)

    def queries(self, befores: list, query_tokens: int, eot_id: int):
        """The model's final hidden state after each query (its last `query_tokens` tokens, the lead
        before them; end-of-text where there is none), [len(befores), hidden]. Queries are padded on
        the right, so each state is read at its own last position, before any padding."""
        rows = [self.lead + ([int(t) for t in b[-query_tokens:]] or [eot_id]) for b in befores]
        # the forward makes logits at every position too: rows per forward so that they stay near 1 GB
        # (Gemma 3's 262,144-token vocabulary: 30 queries of 34 tokens a forward)
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        per = max(1, min(64, 2**28 // (vocab * max(len(r) for r in rows)))) if rows else 1
        out = []
        for first in range(0, len(rows), per):
            chunk = rows[first:first + per]
            longest = max(len(r) for r in chunk)
            ids = torch.tensor([r + [eot_id] * (longest - len(r)) for r in chunk], device=self.model.device)
            states = final_hidden(self.model, ids)
            out.append(states[torch.arange(len(chunk)), torch.tensor([len(r) - 1 for r in chunk])])
        return torch.cat(out) if out else torch.zeros((0, self.store.hidden), device=self.model.device)

    def starts(self, befores: list, params, eot_id: int) -> list[list[int]]:
        """Per query, the train positions of its `params.passages` passages, the nearest first: each
        starts at the token after a near key (moved back where it would run past the split's end);
        a hit less than a passage from a nearer one is skipped while others remain."""
        p, n = params.passage_tokens, params.passages
        _, entries = self.store.nearest(self.queries(befores, params.query_tokens, eot_id), 16 * n)
        last = len(self.tokens) - p
        out = []
        for row in entries.tolist():
            hits = [min(e + 1, last) for e in row if e >= 0]
            chosen: list[int] = []
            for s in hits:
                if len(chosen) < n and all(abs(s - c) >= p for c in chosen):
                    chosen.append(s)
            chosen += [s for s in hits if s not in chosen][:n - len(chosen)]  # too few apart: the next
            out.append(chosen)
        return out

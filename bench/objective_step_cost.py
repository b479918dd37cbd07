"""CPU seconds of one full training step of the base model, plain CE against `loss.kl_base`,
`loss.unlikelihood` and `loss.logit_adjust_tau` (the remedies that cost more than the output
layer's loss).

    python bench/objective_step_cost.py [--model base/model] [--reps 5] [--full-logits]
                                        [--matmul auto|mkl|onednn]

One step = forward of base/model on 16 windows of 128 random token ids, the objective, backward
and an AdamW step, in fp32 on one thread, as the train step runs it (rarelm.train.output: the
loss chunked over tokens from the hidden states where the objective allows it, the full logits
for the KL, or for every objective with `--full-logits`, the path before the chunked loss; the fp32 products
by the backend training picks on this machine, rarelm.train.matmul, or the one `--matmul`
names), the objectives interleaved (their order reversed every other repeat), the first repeat left out as
warm-up; each figure is the median of the process's CPU time (time.process_time), which other
load on a shared machine does not inflate as it does wall time. The KL's extra forward of the
frozen base is in its step. Prints one dict of seconds and one of ratios to plain. The
compute-matched `finetune-longer` of realtext/headline_*.yaml takes its step count from the
KL's ratio.
"""

import argparse
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base/model")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--full-logits", action="store_true",
                        help="every objective on the full logits (the path before the chunked loss)")
    parser.add_argument("--matmul", choices=("auto", "mkl", "onednn"), default="auto",
                        help="the fp32 products' backend (auto: as training picks it, cached per machine)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from rarelm.objectives.objective import Objective
    from rarelm.params import LossParams
    from rarelm.train.matmul import mm, pick_backend, route_linear_layers
    from rarelm.train.output import OutputLayer, output_layer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True).float()
    vocab = model.get_output_embeddings().weight.shape[0]
    buckets = np.zeros(vocab, dtype=np.int64)
    counts = np.random.default_rng(0).integers(0, 1000, vocab)  # logit adjustment's prior
    objectives = {name: Objective.from_params(LossParams(**loss), buckets, vocab, "cpu", counts=counts)
                  for name, loss in (("plain", {}), ("kl_base", {"kl_base": 1.0}),
                                     ("unlikelihood", {"unlikelihood": 1.0}),
                                     ("logit_adjust", {"logit_adjust_tau": 1.0}))}
    objectives["kl_base"].prepare_model(model)  # the frozen copy: the model as loaded, unpatched
    backend = (pick_backend(model, torch.device("cpu"))[0] if args.matmul == "auto"
               else args.matmul)
    if backend == "onednn":  # as rarelm.train.setup.build: the layers, then the output layer
        route_linear_layers(model)
    chunked = output_layer(model, chunked=not args.full_logits,
                           mm=lambda a, b: mm(a, b, backend))
    outputs = {name: OutputLayer() if obj.needs_logits else chunked for name, obj in objectives.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every step the same model
    ids = torch.randint(0, vocab, (16, 129))
    x, y, starts = ids[:, :-1], ids[:, 1:], np.zeros(16, dtype=np.int64)
    times: dict[str, list[float]] = {name: [] for name in objectives}
    for rep in range(args.reps):
        for name in (list(objectives) if rep % 2 else list(objectives)[::-1]):
            t0 = time.process_time()
            with outputs[name].hidden_states():
                scores = outputs[name].scores(model(input_ids=x, use_cache=False).logits)
            loss, _ = objectives[name](scores, y, starts, x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rep:
                times[name].append(time.process_time() - t0)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"fp32 products by {backend}")
    print({name: round(s, 3) for name, s in median.items()})
    print({name: round(s / median["plain"], 3) for name, s in median.items()})


if __name__ == "__main__":
    main()

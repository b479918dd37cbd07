"""`rarelm generate`: continue a prompt with a trained model, streaming the text.

    rarelm generate "The patient presented with" --max-tokens 40
    rarelm generate "Acute" --model path/to/any/causal-lm --greedy
    rarelm generate "Acute" --greedy --logit-adjust 0.5 --counts data/rare/counts.npy

Not a DVC stage: a tool to look at what a model writes (see rarelm/evaluate/generate.py).
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import RarelmError, user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def generate(
    prompt: str = typer.Argument("", help="text to continue ('' starts a fresh document)"),
    model_dir: Path = typer.Option(paths.MODEL, "--model", help="model folder (any local causal LM)"),
    max_tokens: int = typer.Option(100, help="most new tokens"),
    greedy: bool = typer.Option(False, "--greedy", help="always take the likeliest token"),
    temperature: float = typer.Option(0.8, help="sampling temperature (> 0)"),
    top_k: int = typer.Option(50, help="sample among the k likeliest tokens (0 = all)"),
    top_p: float = typer.Option(0.95, help="nucleus: smallest set with this much probability (1 = all)"),
    seed: int = typer.Option(0, help="sampling seed: same seed, same text"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    logit_adjust: float = typer.Option(0.0, "--logit-adjust", metavar="TAU",
                                       help="logit adjustment: logits - TAU * log(train prior); 0 = off"),
    counts: Path = typer.Option(f"{paths.RARE}/counts.npy", help="train token counts for --logit-adjust "
                                "(the rare_terms stage's, same tokenizer as the model)"),
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml whose knn section says "
                                     "whether to mix in kNN-LM and the cache (no such file: off)"),
    datastore: Path = typer.Option(paths.DATASTORE, help="the datastore stage's folder (with knn.enabled)"),
) -> None:
    """Continue PROMPT with a model folder, greedy or sampled, printing tokens as they come."""
    with user_errors("generate"):
        from rarelm.evaluate.generate import Mixing, Sampling, run  # on use: torch takes seconds to import

        if device not in ("auto", "cpu", "cuda"):
            raise RarelmError(f"--device = {device} is not allowed (must be one of auto, cpu, cuda)")
        sampling = Sampling(max_tokens=max_tokens, greedy=greedy, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, logit_adjust=logit_adjust)
        knn = load_params(params_file).knn if params_file.is_file() else None
        run(model_dir, prompt, sampling, device, Mixing(counts, knn, datastore))


if __name__ == "__main__":
    app()

"""The `train` stage's logic: tokenized data + rare buckets + sample weights -> a trained model.

    stage.py       run(): the stage, start to end: checks, then launch (launch.py: torchrun, the
                   workers' error lines and exit codes) or train
    loop.py        train(): set up -> for each step train_step -> meter -> validate -> report
                   -> maybe checkpoint -> finish, on one screen
    setup.py       the Trainer: process group, precision, inputs, model, optimizer, resume
    step.py        train_step -> forward_backward_step (gradient accumulation, clipping)
    output.py      what the step hands the objective: hidden states (chunked loss) or logits
    batches.py     the sample stream and batches of windows;  sampler.py  the weighted sampler
    meter.py       curve rows;  validate.py  val losses;  report.py  progress bar, MLflow rows
    early_stop.py  stop on validation loss (train.early_stop_patience), keep the best weights
    state.py       RunState, RNG states, resume;  checkpoint.py  signed sharded checkpoints
    saving.py      models/model, metrics/train.json, plots/train.csv
    inputs.py      the stage's paths and inputs, the checkpoint key
    dist.py, process.py, precision.py, optim.py, model.py, lora.py, sharding.py
"""

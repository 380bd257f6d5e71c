"""What every run shares (pretraining, fine-tuning, TPU compiles, analysis): config loading
and overrides, optimizers, the train state, metrics and TensorBoard, the workdir and its
lock, and the arguments common to the run commands."""

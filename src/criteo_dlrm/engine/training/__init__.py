"""One training run: the recipe, the processes and their launch, the job, the loop and its step, where a run stands,
divergence, precision, TensorBoard and the profiler."""

"""Cost profiles of the ViT variants: step time, FLOPs, latency, memory, scaling in N.

    python -m profiles                      # all twelve variants: bench, scaling, summary
    python -m profiles favor-rope softmax-rope --tokens 64 256 1024 --scopes layer

* `profiles.bench`: one variant's full ViT at a size and a dataset's
  resolution, in a stripped-down step loop like nanoGPT's bench.py (burn-in,
  then measured steps): training ms/step and images/s, latency per image at
  batch 1 and 256, FLOPs per image from the compiled graph beside an analytic
  count, parameters, peak memory, and a TensorBoard profiler trace with its
  three most expensive operations.
* `profiles.scaling`: the attention layer alone and the whole model, forward
  and forward + backward, over token counts 64 .. 16,384; fitted exponents of
  cost in N and the crossover N where each linear kernel beats softmax.
* `profiles.report`: the JSON results as a Markdown summary with log-log plots.
* `profiles.memory`, `profiles.traces`, `profiles.child`: peak memory,
  profiler traces and their top operations, and the child processes.

Every measurement that can run out of memory or time runs in a child process
(`child.run_in_child`), so an out-of-memory point is recorded as such and the
sweep goes on. Results land in `<out>/<device>/<backend>/`.

Nothing heavy is imported here, so `python -m profiles --help` and the child
processes start without loading a backend twice. The single-purpose tools
(`python -m profiles.engine` and the like) need Keras for their imports, so each
starts it first with TensorFlow's start-up log dropped (`experiments.cli.start_backend`)
and a bad argument is still the one line on stderr every tool promises.
"""

# Defaults of `python -m profiles`, here so that the command line parses without a backend.
BENCH_SIZE = "reference"  # the per-variant bench measures the reference model
BENCH_BATCH = 32
BENCH_DATASETS = ("mnist", "cifar10")  # the resolutions a bench can take (MNIST's is the default)
SCOPES = ("layer", "model")
DEFAULT_PATCHES = tuple(64 * 2**k for k in range(9))  # grids 8x8, 8x16, ..., 128x128

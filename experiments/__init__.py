"""The experiment harness around the `performer_keras` layer library.

Run settings (`run_config`), data (`data`), training with kill-safe
checkpoints (`training`, `checkpoints`, `atomic`), evaluation and FLOPs
(`evaluation`, `flops`, `export`), the multi-seed benchmark and its statistics
(`benchmark`, its `forecast`, `benchmark_profiles`, `aggregate`, `significance`, `report`,
`pilots`), and every command-line option (`cli`). It imports the library,
never the other way round; importing this package loads nothing heavy.
"""

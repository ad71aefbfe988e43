"""KerasTuner searches of each variant's learning rate, weight decay and random features.

    python -m tuning VARIANT --dataset DATASET      one variant (`tuning/__main__.py`)
    python -m tuning.sweep --variants ... --dataset  several, compared (`tuning/sweep.py`)

The spaces are in `tuning/search_spaces.py`, the HyperModel around the
project's ViT builder in `tuning/hypermodel.py`, and the resumable search in
`tuning/search.py`. Nothing is imported here, so `python -m tuning` sets up
TensorFlow's logging before TensorFlow loads.
"""

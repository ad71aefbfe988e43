"""The project's ViT as a KerasTuner `HyperModel`.

`build(hp)` only samples names and numbers into a `RunConfig` and calls the
builder of train.py (`training.build_model`); `fit` calls its training loop
(`training.fit_model`). A trial is therefore the very run that `train.py`
makes of the trial's `RunConfig`, without the crash-safe run folder.
"""

import dataclasses

import keras_tuner

from experiments import training
from tuning import search_spaces

OBJECTIVE = "val_accuracy"
# Hyperband's per-trial budget, set by its oracle in every trial's values.
HYPERBAND_EPOCHS = "tuner/epochs"


class VitHyperModel(keras_tuner.HyperModel):
    """A ViT variant whose `RunConfig` fields in `space` are searched.

    Args:
        base_config: the `RunConfig` every trial starts from (variant, data,
            size, epochs, seed, ...).
        space: {RunConfig field name: a dimension (`Range` or `Choice`)}, see
            `search_spaces`.
        splits: the loaded `data.Splits` of `base_config.dataset`.
    """

    def __init__(self, base_config, space, splits, **kwargs):
        super().__init__(name=base_config.variant, **kwargs)
        self.base_config = base_config
        self.space = space
        self.splits = splits

    def trial_config(self, hp):
        """The trial's complete `RunConfig`: the base with the sampled values.

        Hyperband gives each trial its own epoch budget; the learning-rate
        schedule then spans that budget, as `train.py --epochs` would.
        """
        values = search_spaces.declare(hp, self.space)
        epochs = hp.values.get(HYPERBAND_EPOCHS, self.base_config.epochs)
        return dataclasses.replace(self.base_config, epochs=int(epochs), **values)

    def build(self, hp):
        """The trial's compiled model, from the trial's seed."""
        return training.build_model(self.trial_config(hp), self.splits)

    def fit(self, hp, model, callbacks=(), verbose=0, **kwargs):
        """Train `model` on the training split; validate on the fixed validation split.

        Returns the `History`; the objective is its best `val_accuracy`.
        """
        callbacks = [training.EpochStats(), training.StopOnNaN(), *callbacks]
        return training.fit_model(model, self.trial_config(hp), self.splits, callbacks, verbose=verbose)

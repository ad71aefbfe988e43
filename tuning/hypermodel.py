"""The project's ViT as a KerasTuner `HyperModel`.

`build(hp)` only samples names and numbers and calls the project's builder
(`performer_keras.create_model`) through a `RunConfig`; `fit` trains with the
project's input pipelines (`performer_keras.data`) and optimizer
(`training.build_optimizer`). A trial is therefore the very run that
`train.py` makes of the trial's `RunConfig`, without the crash-safe run folder.
"""

import dataclasses

import keras
import keras_tuner

from performer_keras import data, training
from performer_keras.registry import create_model
from tuning import search_spaces

OBJECTIVE = "val_accuracy"
# Hyperband's per-trial budget, set by its oracle in every trial's values.
HYPERBAND_EPOCHS = "tuner/epochs"


class VitHyperModel(keras_tuner.HyperModel):
    """A ViT variant whose `RunConfig` fields in `space` are searched.

    Args:
        base_config: the `RunConfig` every trial starts from (variant, data,
            size, epochs, seed, ...).
        space: {RunConfig field name: `LogUniform` or `Choice`}, see
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
        config = self.trial_config(hp)
        return create_model(
            config.variant,
            image_shape=self.splits.image_shape,
            num_classes=self.splits.num_classes,
            mean=self.splits.mean,
            std=self.splits.std,
            **config.model_overrides(),
        )

    def fit(self, hp, model, callbacks=(), verbose=0, **kwargs):
        """Train `model` on the training split; validate on the fixed validation split.

        Returns the `History`; the objective is its best `val_accuracy`.
        """
        config = self.trial_config(hp)
        (x_train, y_train), (x_val, y_val) = self.splits.train, self.splits.validation
        steps = data.steps_per_epoch(len(x_train), config.batch_size)
        model.compile(
            optimizer=training.build_optimizer(config, steps),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        train_ds = data.train_pipeline(
            x_train, y_train, config.batch_size, config.seed,
            training.augmentation(config, self.splits), 0, config.epochs,
        )
        val_ds = data.eval_pipeline(x_val, y_val, config.batch_size)
        # A diverged trial stops and keeps the accuracy it had: a bad trial, not an error.
        callbacks = [training.EpochStats(), keras.callbacks.TerminateOnNaN(), *callbacks]
        return model.fit(
            train_ds, epochs=config.epochs, steps_per_epoch=steps, validation_data=val_ds,
            callbacks=callbacks, verbose=verbose,
        )

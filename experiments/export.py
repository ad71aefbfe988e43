"""SavedModel export whose serving signature takes uint8 images."""

import keras


def export_saved_model(model, export_dir):
    """Write `model` as a TF SavedModel with endpoint `serve`: uint8 (batch, H, W, C) -> probabilities.

    The model normalises pixels itself, so serving only casts uint8 to float32.
    """
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda images: model(tf.cast(images, "float32"), training=False),
        input_signature=[tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.uint8, name="images")],
    )
    archive.write_out(str(export_dir), verbose=False)
    return export_dir

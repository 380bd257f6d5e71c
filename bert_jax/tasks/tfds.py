"""Task examples from tensorflow-datasets by name (``glue/cola``, ``squad/v1.1``, ``conll2003``).

The only module of ``bert_jax.tasks`` that touches TensorFlow, and only inside ``read_tfds``:
local files need neither. SWAG is not in tensorflow-datasets; read its CSVs with ``read``.
"""

from __future__ import annotations

from bert_jax.errors import BertJaxError
from bert_jax.tasks.base import ExampleList
from bert_jax.tasks.glue import TFDS_SPLITS
from bert_jax.tasks.registry import task_for_tfds


def read_tfds(name: str, split: str, data_dir: str | None = None,
              download: bool = False) -> ExampleList:
    """Reads split ``split`` of tensorflow-datasets ``name`` as the task's examples.

    ``split`` takes our names (dev, dev_matched, ...) or tfds' (validation, ...). By default the
    dataset must already be prepared in ``data_dir`` (nothing is downloaded at run time).
    """
    task = task_for_tfds(name)
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise BertJaxError(f"reading {name!r} from tensorflow-datasets needs the "
                           "tensorflow-datasets package; or read the local files") from None
    tfds_split = TFDS_SPLITS.get(split, split)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        if download:
            builder.download_and_prepare()
        ds = builder.as_dataset(split=tfds_split)
    except (tfds.core.registered.DatasetNotFoundError, AssertionError, ValueError,
            KeyError) as e:
        raise BertJaxError(f"tensorflow-datasets {name!r} split {tfds_split!r}: {e}") from None
    label_names = None
    features = builder.info.features
    for key in ("label", "ner"):
        if key in features:
            feature = features[key]
            feature = getattr(feature, "feature", feature)  # Sequence(ClassLabel) -> ClassLabel
            label_names = getattr(feature, "names", None)
    return task.from_tfds(tfds.as_numpy(ds), split, label_names)

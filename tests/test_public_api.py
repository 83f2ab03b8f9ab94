"""The public API is exactly what the documentation (README.md and docs/) documents."""

import dataservice
from dataservice import errors

PUBLIC = {
    "AUTOTUNE", "CrossTrainerCache", "Dataset", "DispatchServer", "DispatcherConfig", "FixedLengthRecordDataset", "INFINITE_CARDINALITY",
    "Options", "ShardingPolicy", "SqlDataset", "TFRecordDataset", "TFRecordWriter", "TensorSpec", "TextLineDataset",
    "ThreadingOptions", "UNKNOWN_CARDINALITY", "WorkerConfig", "WorkerServer", "distribute", "errors",
    "from_dataset_id", "register_dataset", "ship_by_reference", "ship_by_value", "shuffle_and_repeat",
    "snapshot", "save", "load", "distributed_save", "catalogue", "SHARD_HINT",
}

CATALOGUE = {
    "BenchmarkResult", "BuilderConfig", "ClassLabel", "DatasetBuilder", "DatasetInfo", "DownloadConfig",
    "DownloadManager", "FeatureConnector", "FeaturesDict", "GeneratorBasedBuilder", "Image", "InputContext",
    "ReadConfig", "ReadInstruction", "ReadOnlyBuilder", "Scalar", "SplitDict", "SplitInfo", "Tensor", "Text",
    "Version", "as_numpy", "benchmark", "builder", "builder_from_directory", "default_data_dir", "even_splits",
    "list_builders", "load",
}


def test_all_is_the_documented_api():
    assert set(dataservice.__all__) == PUBLIC
    for name in dataservice.__all__:
        assert hasattr(dataservice, name), name


def test_the_catalogue_is_the_documented_api():
    from dataservice import catalogue

    assert set(catalogue.__all__) == CATALOGUE
    for name in catalogue.__all__:
        assert hasattr(catalogue, name), name


def test_every_error_derives_from_the_base():
    for name in errors.__all__:
        kind = getattr(errors, name)
        assert issubclass(kind, errors.DataServiceError), name


def test_cardinality_constants_match_tf_data():
    assert dataservice.INFINITE_CARDINALITY == -1
    assert dataservice.UNKNOWN_CARDINALITY == -2
    assert dataservice.AUTOTUNE == -1
    assert dataservice.SHARD_HINT == -1  # tf.data.experimental.SHARD_HINT

"""Dataset.window and Dataset.group_by_window: the reference documentation's examples, every parameter
combination, nested elements, cardinality, element_spec and the errors TensorFlow gives."""

from tests.tf_parity.case import Case

# The seed's sharded TFRecord-writing example (tf.data.experimental.TFRecordWriter): TensorFlow traces
# reduce_func, so there the file name is made with its string ops; here it is a Python string.
_SHARDS = """
import os
NUM_SHARDS = 3
if 'tf' in globals():
    def shard_name(key):
        return tf.strings.join([tmp + 'shard-', tf.strings.as_string(key)])
else:
    def shard_name(key):
        return tmp + 'shard-' + str(key)
def reduce_func(key, dataset):
    filename = shard_name(key)
    writer = TFRecordWriter(filename)
    writer.write(dataset.map(lambda _, x: x))
    return D.from_tensors(filename)
dataset = D.from_tensor_slices([b'record-%d' % i for i in range(10)])
dataset = dataset.enumerate()
GROUPING
names = [os.path.basename(n.decode() if isinstance(n, bytes) else n) for n in dataset.as_numpy_iterator()]
contents = [list(TFRecordDataset(tmp + 'shard-%d' % k).as_numpy_iterator()) for k in range(NUM_SHARDS)]
result = (names, contents)
"""

_NUMPY = "def to_numpy(ds):\n    return list(ds.as_numpy_iterator())\n"

CASES = [
    # --- the reference documentation's examples, as written -----------------------------------
    Case("doc_window_2", "ds = D.range(7).window(2)"),
    Case("doc_window_2_printed", "result = [list(w.as_numpy_iterator()) for w in D.range(7).window(2)]"),
    Case("doc_window_3_2_1_true", "ds = D.range(7).window(3, 2, 1, True)"),
    Case("doc_window_3_1_2_true", "ds = D.range(7).window(3, 1, 2, True)"),
    Case("doc_window_nested_tuple", "nested = ([1, 2, 3, 4], [5, 6, 7, 8])\n"
         "dataset = D.from_tensor_slices(nested).window(2)\n" + _NUMPY +
         "result = [tuple(to_numpy(component) for component in window) for window in dataset]",
         literal_dtypes=True),
    Case("doc_window_nested_tuple_ds", "ds = D.from_tensor_slices(([1, 2, 3, 4], [5, 6, 7, 8])).window(2)",
         literal_dtypes=True),
    Case("doc_window_dict", "dataset = D.from_tensor_slices({'a': [1, 2, 3, 4]})\ndataset = dataset.window(2)\n"
         + _NUMPY + "result = [{'a': to_numpy(window['a'])} for window in dataset]", literal_dtypes=True),
    Case("doc_window_dict_ds", "ds = D.from_tensor_slices({'a': [1, 2, 3, 4]}).window(2)", literal_dtypes=True),

    # --- parameters -------------------------------------------------------------------------------
    Case("shift_lt_size", "ds = D.range(7).window(3, 1)"),
    Case("shift_lt_size_drop", "ds = D.range(7).window(3, 1, drop_remainder=True)"),
    Case("shift_gt_size", "ds = D.range(10).window(2, 3)"),
    Case("shift_gt_size_drop", "ds = D.range(10).window(2, 3, drop_remainder=True)"),
    Case("shift_gt_size_past_end", "ds = D.range(7).window(2, 5)"),
    Case("stride", "ds = D.range(7).window(3, 1, 2)"),
    Case("stride_gt_shift_partial", "ds = D.range(5).window(2, 1, 3)"),
    Case("stride_shift_size", "ds = D.range(12).window(2, 3, 2)"),
    Case("stride_shift_size_drop", "ds = D.range(12).window(3, 4, 3, True)"),
    Case("drop_exact_fit", "ds = D.range(6).window(3, drop_remainder=True)"),
    Case("size_1", "ds = D.range(4).window(1)"),
    Case("size_1_stride", "ds = D.range(4).window(1, 1, 5)"),
    Case("size_gt_input", "ds = D.range(3).window(5)"),
    Case("size_gt_input_drop", "ds = D.range(3).window(5, drop_remainder=True)"),
    Case("empty_input", "ds = D.range(0).window(2)"),
    Case("empty_input_drop", "ds = D.range(0).window(2, 1, 1, True)"),
    Case("numpy_int_args", "ds = D.range(8).window(np.int64(3), shift=np.int32(2), stride=np.int64(1))"),
    Case("shift_none_explicit", "ds = D.range(5).window(2, shift=None)"),

    # --- nested elements ----------------------------------------------------------------------------
    Case("nested_deep", "ds = D.zip((D.range(4), (D.range(10, 14), D.range(20, 24)))).window(3)"),
    Case("nested_dict_two_keys", "ds = D.from_tensor_slices({'b': np.arange(5, dtype=np.int64), "
         "'a': np.arange(5, dtype=np.float32) / 2}).window(2, 1, 2)"),
    Case("nested_matrix_spec", "ds = D.from_tensor_slices(np.arange(24, dtype=np.float32).reshape(6, 2, 2)).window(4)"),
    Case("strings", "ds = D.from_tensor_slices([b'a', b'b', b'c', b'd', b'e']).window(2, 2, 2)"),
    Case("window_of_windows", "ds = D.range(6).window(3).window(2)"),
    Case("window_of_windows_values",
         "result = [[list(inner.as_numpy_iterator()) for inner in outer] for outer in D.range(6).window(2).window(2)]"),

    # --- using windows ------------------------------------------------------------------------------
    Case("flat_map_batch", "ds = D.range(10).window(3, 1, drop_remainder=True).flat_map(lambda w: w.batch(3))"),
    Case("flat_map_batch_partial", "ds = D.range(5).window(3, 2).flat_map(lambda w: w.batch(3))"),
    Case("flat_map_zip_components", "ds = D.from_tensor_slices((np.arange(6), np.arange(6) * 10)).window(2)"
         ".flat_map(lambda a, b: D.zip((a.batch(2), b.batch(2))))"),
    Case("flat_map_zip_dict", "ds = D.from_tensor_slices({'x': np.arange(5), 'y': np.arange(5) * 2}).window(2)"
         ".flat_map(lambda w: D.zip(w).batch(2))"),
    Case("map_identity", "ds = D.range(7).window(3).map(lambda w: w)"),
    Case("map_reduce", "ds = D.range(7).window(3).map(lambda w: w.reduce(np.int64(0), lambda s, x: s + x))"),
    Case("filter_full_windows", "ds = D.range(7).window(3, 2).filter(lambda w: w.cardinality() == 3)"),
    Case("take_skip_windows", "ds = D.range(20).window(3).skip(2).take(3)"),
    Case("window_cardinalities", "result = [int(w.cardinality()) for w in D.range(7).window(3, 2)]"),
    Case("interleave_windows", "ds = D.range(8).window(4).interleave(lambda w: w, cycle_length=2)"),
    Case("window_infinite_input", "ds = D.range(3).repeat().window(2, 1)", max_elements=5),
    Case("window_batch_unbatch", "ds = D.range(5).window(2).batch(2).unbatch()"),
    Case("window_after_batch", "ds = D.range(8).batch(2).window(2).flat_map(lambda w: w.batch(2))"),

    # --- cardinality ------------------------------------------------------------------------------
    Case("cardinality_forms", "result = [int(D.range(n).window(s, sh, st, d).cardinality()) "
         "for n in (0, 1, 7, 10) for s, sh, st, d in ((3, None, 1, False), (3, None, 1, True), (3, 2, 2, True), "
         "(2, 3, 1, False), (4, 1, 3, True))]"),
    Case("cardinality_infinite", "result = int(D.range(3).repeat().window(2).cardinality())"),
    Case("cardinality_unknown", "result = int(D.range(9).filter(lambda x: x > 2).window(2).cardinality())"),

    # --- errors -------------------------------------------------------------------------------------
    Case("error_size_0", "ds = D.range(7).window(0)"),
    Case("error_size_negative", "ds = D.range(7).window(-2)"),
    Case("error_shift_0", "ds = D.range(7).window(2, 0)"),
    Case("error_stride_0", "ds = D.range(7).window(2, 1, 0)"),
    Case("error_size_float", "ds = D.range(7).window(2.5)"),
    Case("error_size_none", "ds = D.range(7).window(None)"),
    Case("error_drop_remainder_str", "ds = D.range(7).window(2, drop_remainder='yes')"),

    # --- group_by_window ----------------------------------------------------------------------------
    Case("gbw_basic", "ds = D.range(10).group_by_window(lambda x: x % 2, lambda k, w: w.batch(5), 5)"),
    Case("gbw_flush_interleaved", "ds = D.range(10).group_by_window(lambda x: x % 2, lambda k, w: w.batch(2), 2)"),
    Case("gbw_end_in_key_order", "ds = D.from_tensor_slices(np.array([5, 3, 9, 1, 3, 5, 7], np.int64))"
         ".group_by_window(lambda x: x, lambda k, w: w.batch(10), 100)"),
    Case("gbw_window_size_func", "ds = D.range(12).group_by_window(lambda x: x % 3, lambda k, w: w.batch(10), "
         "window_size_func=lambda k: k + 1)"),
    Case("gbw_key_in_reduce", "ds = D.range(9).group_by_window(lambda x: x % 3, "
         "lambda k, w: w.batch(3).map(lambda b: (k, b)), 3)"),
    Case("gbw_tuple_elements", "ds = D.range(8).map(lambda x: (x, x * 10)).group_by_window(lambda a, b: a % 2, "
         "lambda k, w: w.map(lambda a, b: a + b), 3)"),
    Case("gbw_dict_elements", "ds = D.from_tensor_slices({'k': np.array([1, 2, 1, 2, 1], np.int64), "
         "'v': np.arange(5, dtype=np.float32)}).group_by_window(lambda d: d['k'], lambda k, w: w.batch(2), 2)"),
    Case("gbw_spec_static", "ds = D.range(10).group_by_window(lambda x: x % 2, "
         "lambda k, w: w.batch(4, drop_remainder=True), 4)"),
    Case("gbw_reduce_take", "ds = D.range(20).group_by_window(lambda x: x % 4, lambda k, w: w.take(1), 5)"),
    Case("gbw_empty_input", "ds = D.range(0).group_by_window(lambda x: x, lambda k, w: w, 2)"),
    Case("gbw_literal_key", "ds = D.range(5).group_by_window(lambda x: 0, lambda k, w: w.batch(2), 2)"),
    Case("gbw_infinite", "ds = D.range(4).repeat().group_by_window(lambda x: x % 2, lambda k, w: w.batch(2), 2)",
         max_elements=6),
    Case("gbw_window_of_windows", "ds = D.range(6).window(2).group_by_window(lambda w: w.cardinality() % 2, "
         "lambda k, w: w.flat_map(lambda x: x), 3)"),
    Case("gbw_error_both_sizes", "ds = D.range(4).group_by_window(lambda x: x, lambda k, w: w, 2, lambda k: 2)"),
    Case("gbw_error_no_size", "ds = D.range(4).group_by_window(lambda x: x, lambda k, w: w)"),
    Case("gbw_error_window_size_0", "ds = D.range(4).group_by_window(lambda x: x % 2, lambda k, w: w, 0)"),
    Case("gbw_error_window_size_negative", "ds = D.range(4).group_by_window(lambda x: x % 2, lambda k, w: w, -3)"),
    Case("gbw_error_window_size_func_0", "ds = D.range(4).group_by_window(lambda x: x % 2, lambda k, w: w, "
         "window_size_func=lambda k: k)"),
    Case("gbw_error_key_func_not_callable", "ds = D.range(4).group_by_window(3, lambda k, w: w, 2)"),
    Case("gbw_error_reduce_func_not_callable", "ds = D.range(4).group_by_window(lambda x: x, 3, 2)"),
    Case("gbw_error_window_size_func_not_callable", "ds = D.range(4).group_by_window(lambda x: x, "
         "lambda k, w: w, window_size_func=3)"),
    Case("gbw_error_window_size_float", "ds = D.range(4).group_by_window(lambda x: x, lambda k, w: w, 2.5)"),
    Case("gbw_seed_tfrecord_shards", _SHARDS.replace(
        "GROUPING", "dataset = dataset.group_by_window(lambda i, _: i % NUM_SHARDS, reduce_func, "
                    "np.iinfo(np.int64).max)")),
    Case("gbw_seed_tfrecord_shards_experimental", _SHARDS.replace(
        "GROUPING", "dataset = dataset.apply(experimental.group_by_window(\n"
        "    lambda i, _: i % NUM_SHARDS, reduce_func, np.iinfo(np.int64).max\n))")),
]

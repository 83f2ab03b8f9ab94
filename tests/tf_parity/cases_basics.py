"""Sources and common transformations: the framework's own smoke cases."""

from tests.tf_parity.case import Case

CASES = [
    Case("range", "ds = D.range(5)"),
    Case("range_start_stop_step", "ds = D.range(2, 10, 3)"),
    Case("from_tensor_slices_tuple", "ds = D.from_tensor_slices((np.arange(3, dtype=np.int64), np.array([b'a', b'b', b'c'])))"),
    Case("map_batch", "ds = D.range(10).map(lambda x: x * 2).batch(4)"),
    Case("batch_drop_remainder", "ds = D.range(10).batch(4, drop_remainder=True)"),
    Case("literals", "ds = D.from_tensor_slices([1, 2, 3])", literal_dtypes=True),
    Case("dict_elements", "ds = D.from_tensor_slices({'a': np.arange(2, dtype=np.int64), 'b': np.ones(2, np.float32)})"),
    Case("take_skip", "ds = D.range(10).skip(2).take(3)"),
    Case("filter", "ds = D.range(10).filter(lambda x: x % 3 == 0)"),
    Case("repeat_infinite", "ds = D.range(3).repeat()", max_elements=7),
    Case("shuffle_unordered", "ds = D.range(20).shuffle(5, seed=1)", unordered=True),
    Case("flat_map", "ds = D.range(3).flat_map(lambda x: D.range(x))"),
    Case("zip_uneven", "ds = D.zip((D.range(3), D.range(5)))"),
    Case("iterate_list", "result = [x for x in D.range(3).as_numpy_iterator()]"),
]

"""The reference documentation's examples of tf.data.Dataset's transformations (../shared/seeds/002_*), as
written there but for what only TensorFlow has: ``tf.fill``/``tf.constant`` become numpy or dataset
operations that both sides run, ``tf.py_function`` a Python function (chosen with ``'tf' in globals()``:
only TensorFlow's side binds ``tf``), ``Dataset.range(..., output_type=tf.int32)`` a generator declaring
int32. Sources (range, from_tensor_slices, ...), windows and the experimental statistics have their own
case files. Python literals are int32/float32 in TensorFlow: those cases set ``literal_dtypes``.
"""

from tests.tf_parity.case import Case

# The padded_batch examples' A: Dataset.range(1, 5, output_type=tf.int32).map(lambda x: tf.fill([x], x)).
_A = ("D.from_generator(lambda: iter([np.full(n, n, np.int32) for n in range(1, 5)]), "
      "output_signature=TensorSpec([None], np.int32))")

_UPPER = """
d = D.from_tensor_slices(['hello', 'world'])
if 'tf' in globals():
    def upper_case_fn(t):
        return t.numpy().decode('utf-8').upper()
    d = d.map(lambda x: tf.py_function(func=upper_case_fn, inp=[x], Tout=tf.string))
else:
    d = d.map(lambda x: x.upper())
result = list(d.as_numpy_iterator())
"""

CASES = [
    # as_numpy_iterator
    Case("as_numpy_iterator", "result = list(D.from_tensor_slices([1, 2, 3]).as_numpy_iterator())",
         literal_dtypes=True),
    Case("as_numpy_iterator_nested", "ds = D.from_tensor_slices({'a': ([1, 2], [3, 4]), 'b': [5, 6]})\n"
                                     "result = list(ds.as_numpy_iterator())", literal_dtypes=True),
    # batch
    Case("batch", "ds = D.range(8).batch(3)"),
    Case("batch_drop_remainder", "ds = D.range(8).batch(3, drop_remainder=True)"),
    # cache
    Case("cache_memory", "dataset = D.range(5).map(lambda x: x ** 2).cache()\n"
                         "result = (list(dataset.as_numpy_iterator()), list(dataset.as_numpy_iterator()))"),
    Case("cache_file_same_file", "dataset = D.range(5).cache(tmp + 'file')\n"
                                 "first = list(dataset.as_numpy_iterator())\n"
                                 "dataset = D.range(10).cache(tmp + 'file')  # Same file!\n"
                                 "result = (first, list(dataset.as_numpy_iterator()))"),
    # cardinality
    Case("cardinality", "dataset = D.range(42)\nn = dataset.cardinality()\ndataset = dataset.repeat()\n"
                        "infinite = dataset.cardinality()\ndataset = dataset.filter(lambda x: True)\n"
                        "result = (int(n), int(infinite), int(dataset.cardinality()))"),
    # concatenate
    Case("concatenate", "a = D.range(1, 4)\nb = D.range(4, 8)\nds = a.concatenate(b)"),
    Case("concatenate_with_zip_refused", "a = D.range(1, 4)\nb = D.range(4, 8)\nc = D.zip((a, b))\n"
                                         "ds = a.concatenate(c)"),
    Case("concatenate_with_strings_refused", "a = D.range(1, 4)\nd = D.from_tensor_slices(['a', 'b', 'c'])\n"
                                             "ds = a.concatenate(d)"),
    # enumerate
    Case("enumerate_start", "ds = D.from_tensor_slices([1, 2, 3]).enumerate(start=5)", literal_dtypes=True),
    Case("enumerate_nested", "ds = D.from_tensor_slices([(7, 8), (9, 10)]).enumerate()", literal_dtypes=True),
    # filter
    Case("filter", "ds = D.from_tensor_slices([1, 2, 3]).filter(lambda x: x < 3)", literal_dtypes=True),
    Case("filter_equal", "dataset = D.from_tensor_slices([1, 2, 3]).filter(lambda x: x < 3)\n"
                         "def filter_fn(x):\n    return x == 1\nds = dataset.filter(filter_fn)", literal_dtypes=True),
    # flat_map
    Case("flat_map", "dataset = D.from_tensor_slices([[1, 2, 3], [4, 5, 6], [7, 8, 9]])\n"
                     "ds = dataset.flat_map(lambda x: D.from_tensor_slices(x))", literal_dtypes=True),
    # interleave
    Case("interleave_blocks", "dataset = D.range(1, 6)\n"
                              "ds = dataset.interleave(lambda x: D.from_tensors(x).repeat(6), cycle_length=2, "
                              "block_length=4)"),
    Case("interleave_files", "filenames = []\nfor i in range(4):\n"
                             "    filenames.append(tmp + 'file%d.txt' % (i + 1))\n"
                             "    with open(filenames[-1], 'w') as f:\n"
                             "        f.write(''.join('%d-%d\\n' % (i, j) for j in range(20)))\n"
                             "dataset = D.from_tensor_slices(filenames)\n"
                             "ds = dataset.interleave(lambda x: TextLineDataset(x).map(lambda l: l, "
                             "num_parallel_calls=1), cycle_length=4, block_length=16)"),
    Case("interleave_nondeterministic", "filenames = []\nfor i in range(4):\n"
                                        "    filenames.append(tmp + 'file%d.txt' % (i + 1))\n"
                                        "    with open(filenames[-1], 'w') as f:\n"
                                        "        f.write(''.join('%d-%d\\n' % (i, j) for j in range(5)))\n"
                                        "dataset = D.from_tensor_slices(filenames)\n"
                                        "ds = dataset.interleave(lambda x: TextLineDataset(x), cycle_length=4, "
                                        "num_parallel_calls=AUTOTUNE, deterministic=False)", unordered=True),
    # map
    Case("map_add_one", "ds = D.range(1, 6).map(lambda x: x + 1)"),
    Case("map_range", "ds = D.range(5).map(lambda x: x + 1)"),
    Case("map_project_first", "dataset = D.from_tensor_slices((np.array([1, 2, 3], np.int32), "
                              "np.array([b'foo', b'bar', b'baz'])))\nds = dataset.map(lambda x_int, y_str: x_int)"),
    Case("map_dict_elements", "dataset = D.from_tensor_slices({'a': np.array([1, 2, 3], np.int32), "
                              "'b': np.array([b'foo', b'bar', b'baz'])})\nds = dataset.map(lambda d: d['a'] * 2)"),
    Case("map_returns_two", "dataset = D.range(3)\n"
                            "def g(x):\n    return np.float32(37.0), np.array([b'Foo', b'Bar', b'Baz'])\n"
                            "result = list(dataset.map(g).as_numpy_iterator())"),
    Case("map_returns_primitives", "dataset = D.range(3)\n"
                                   "def h(x):\n    return 37.0, [b'Foo', b'Bar'], "
                                   "np.array([1.0, 2.0], dtype=np.float64)\n"
                                   "result = list(dataset.map(h).as_numpy_iterator())", literal_dtypes=True),
    Case("map_returns_nested", "dataset = D.range(3)\n"
                               "def i(x):\n    return (37.0, [42, 16]), b'foo'\n"
                               "result = list(dataset.map(i).as_numpy_iterator())", literal_dtypes=True),
    Case("map_python_function", _UPPER),
    Case("map_parallel_nondeterministic", "dataset = D.range(1, 6)\n"
                                          "ds = dataset.map(lambda x: x + 1, num_parallel_calls=AUTOTUNE, "
                                          "deterministic=False)", unordered=True),
    # padded_batch
    Case("padded_batch_smallest", f"A = {_A}\nds = A.padded_batch(2)"),
    Case("padded_batch_fixed", f"A = {_A}\nds = A.padded_batch(2, padded_shapes=5)"),
    Case("padded_batch_custom_value", f"A = {_A}\nds = A.padded_batch(2, padded_shapes=5, padding_values=-1)"),
    Case("padded_batch_components",
         "elements = [([1, 2, 3], [10]), ([4, 5], [11, 12])]\n"
         "dataset = D.from_generator(lambda: iter([(np.array(a, np.int32), np.array(b, np.int32)) "
         "for a, b in elements]), output_signature=(TensorSpec([None], np.int32), TensorSpec([None], np.int32)))\n"
         "ds = dataset.padded_batch(2, padded_shapes=([4], [None]), padding_values=(-1, 100))"),
    Case("padded_batch_single_value_many_components", f"A = {_A}\nds = D.zip((A, A)).padded_batch(2, "
                                                      "padding_values=-1)"),
    # prefetch
    Case("prefetch", "ds = D.range(3).prefetch(2)"),
    # reduce
    Case("reduce_count", "result = D.range(5).reduce(np.int64(0), lambda x, _: x + 1)"),
    Case("reduce_sum", "result = D.range(5).reduce(np.int64(0), lambda x, y: x + y)"),
    # repeat
    Case("repeat", "ds = D.from_tensor_slices([1, 2, 3]).repeat(3)", literal_dtypes=True),
    # shard
    Case("shard_0", "A = D.range(10)\nds = A.shard(num_shards=3, index=0)"),
    Case("shard_1", "A = D.range(10)\nds = A.shard(num_shards=3, index=1)"),
    Case("shard_2", "A = D.range(10)\nds = A.shard(num_shards=3, index=2)"),
    # shuffle (the orders are random: the elements of each epoch, and whether epochs differ)
    Case("shuffle_reshuffle_repeat", "dataset = D.range(3).shuffle(3, reshuffle_each_iteration=True).repeat(2)\n"
                                     "v = [int(x) for x in dataset.as_numpy_iterator()]\n"
                                     "result = (sorted(v[:3]), sorted(v[3:]))"),
    Case("shuffle_no_reshuffle_repeat", "dataset = D.range(3).shuffle(3, reshuffle_each_iteration=False).repeat(2)\n"
                                        "v = [int(x) for x in dataset.as_numpy_iterator()]\n"
                                        "result = (sorted(v[:3]), v[:3] == v[3:])"),
    Case("shuffle_epochs_by_iteration", "dataset = D.range(3).shuffle(3, reshuffle_each_iteration=True)\n"
                                        "result = (sorted(dataset.as_numpy_iterator()), "
                                        "sorted(dataset.as_numpy_iterator()))"),
    Case("shuffle_same_order_by_iteration", "dataset = D.range(3).shuffle(3, reshuffle_each_iteration=False)\n"
                                            "a = list(dataset.as_numpy_iterator())\n"
                                            "result = (a == list(dataset.as_numpy_iterator()), sorted(a))"),
    # skip, take
    Case("skip", "ds = D.range(10).skip(7)"),
    Case("take", "ds = D.range(10).take(3)"),
    # unbatch
    Case("unbatch", "elements = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]\n"
                    "dataset = D.from_generator(lambda: iter([np.array(e, np.int64) for e in elements]), "
                    "output_signature=TensorSpec([None], np.int64))\nds = dataset.unbatch()"),
    # with_options: a nondeterministic interleave
    Case("with_options_nondeterministic", "ds = D.range(5)\n"
                                          "ds = ds.interleave(lambda x: D.range(5), cycle_length=3, "
                                          "num_parallel_calls=3)\n"
                                          "options = Options()\noptions.deterministic = False\n"
                                          "ds = ds.with_options(options)", unordered=True),
    # zip
    Case("zip_pair", "a = D.range(1, 4)\nb = D.range(4, 7)\nds = D.zip((a, b))"),
    Case("zip_pair_swapped", "a = D.range(1, 4)\nb = D.range(4, 7)\nds = D.zip((b, a))"),
    Case("zip_three", "a = D.range(1, 4)\nb = D.range(4, 7)\nc = D.range(7, 13).batch(2)\nds = D.zip((a, b, c))"),
    Case("zip_shortest", "a = D.range(1, 4)\nd = D.range(13, 15)\nds = D.zip((a, d))"),
    Case("zip_features_labels", "features = np.array([[1, 3], [2, 1], [3, 3]], np.int32)\n"
                                "labels = np.array([b'A', b'B', b'A'])\n"
                                "ds = D.zip((D.from_tensor_slices(features), D.from_tensor_slices(labels)))"),
    # apply, element_spec, unique, take_while, unbatch (the experimental transformations' examples)
    Case("apply", "dataset = D.range(100)\ndef dataset_fn(ds):\n    return ds.filter(lambda x: x < 5)\n"
                  "ds = dataset.apply(dataset_fn)"),
    Case("element_spec", "ds = D.from_tensor_slices([1, 2, 3])", literal_dtypes=True),
    Case("unique", "ds = D.from_tensor_slices([1, 37, 2, 37, 2, 1]).unique()", literal_dtypes=True),
    Case("unbatch_strings", "ds = D.from_generator(lambda: iter([np.array(list(s)).astype(np.bytes_) "
                            "for s in ('abc', 'ab', 'abcd')]), output_signature=TensorSpec([None], np.bytes_))"
                            ".unbatch()"),
    Case("take_while", "ds = D.range(10).take_while(lambda x: x < 5)"),
    Case("shuffle_and_repeat", "d = D.from_tensor_slices([1, 2, 3]).shuffle(2, reshuffle_each_iteration=True)"
                               ".repeat(2)\nv = [int(x) for x in d.as_numpy_iterator()]\n"
                               "result = (sorted(v[:3]), sorted(v[3:]))"),
]

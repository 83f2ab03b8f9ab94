"""Every transformation of the reference documentation, its arguments, and what tf.data refuses (and how).

Issue 16's "differences to remove" are here too: negative counts, prefetch(0), negative seeds,
padding_values of another dtype, concatenate of different structures, unbatch's cardinality,
unique's dtypes, and the kinds of error of wrong arguments. The reference documentation's own
examples are in ``cases_documented.py``.
"""

from tests.tf_parity.case import Case

# A dataset of int32 vectors of lengths 1..4 (x repeated x times), its spec known without an element.
_A32 = ("D.from_generator(lambda: iter([np.full(n, n, np.int32) for n in range(1, 5)]), "
        "output_signature=TensorSpec([None], np.int32))")
_A64 = ("D.from_generator(lambda: iter([np.full(n, n, np.int64) for n in range(1, 5)]), "
        "output_signature=TensorSpec([None], np.int64))")
_F64 = ("D.from_generator(lambda: iter([np.full(n, n / 2, np.float64) for n in range(1, 4)]), "
        "output_signature=TensorSpec([None], np.float64))")
_F32 = ("D.from_generator(lambda: iter([np.full(n, n / 2, np.float32) for n in range(1, 4)]), "
        "output_signature=TensorSpec([None], np.float32))")
_S = ("D.from_generator(lambda: iter([np.array([b'a'] * n) for n in range(1, 4)]), "
      "output_signature=TensorSpec([None], np.bytes_))")

CASES = [
    # --- map ----------------------------------------------------------------------------------------
    Case("map_scalar", "ds = D.range(5).map(lambda x: x * 3 + 1)"),
    Case("map_tuple_args", "ds = D.zip((D.range(4), D.range(10, 14))).map(lambda a, b: a * b)"),
    Case("map_returns_tuple", "ds = D.range(3).map(lambda x: (x, x * 2))"),
    Case("map_returns_nested", "ds = D.range(3).map(lambda x: {'a': x, 'b': (x + 1, x - 1)})"),
    Case("map_dict_input", "ds = D.from_tensor_slices({'a': np.arange(3), 'b': np.arange(3) * 10})"
                           ".map(lambda d: d['a'] + d['b'])"),
    Case("map_then_map_unpacks", "ds = D.range(3).map(lambda x: (x, x * 10)).map(lambda a, b: a + b)"),
    Case("map_float", "ds = D.from_tensor_slices(np.arange(4, dtype=np.float32)).map(lambda x: x / 2)"),
    Case("map_cast_literal_dtypes", "ds = D.range(3).map(lambda x: (x, 2.5))", literal_dtypes=True),
    Case("map_parallel_deterministic",
         "ds = D.range(20).map(lambda x: x * x, num_parallel_calls=4, deterministic=True)"),
    Case("map_parallel_autotune", "ds = D.range(20).map(lambda x: x + 1, num_parallel_calls=AUTOTUNE)"),
    Case("map_parallel_nondeterministic",
         "ds = D.range(30).map(lambda x: x - 1, num_parallel_calls=3, deterministic=False)", unordered=True),
    Case("map_parallel_options_nondeterministic",
         "o = Options()\no.deterministic = False\n"
         "ds = D.range(30).map(lambda x: x * 2, num_parallel_calls=2).with_options(o)", unordered=True),
    Case("map_over_batches", "ds = D.range(7).batch(3).map(lambda b: b * 10)"),
    Case("map_not_callable", "ds = D.range(3).map(5)"),
    Case("map_num_parallel_calls_zero", "ds = D.range(3).map(lambda x: x, num_parallel_calls=0)"),
    Case("map_num_parallel_calls_negative", "ds = D.range(3).map(lambda x: x, num_parallel_calls=-5)"),
    # --- filter -------------------------------------------------------------------------------------
    Case("filter_compare", "ds = D.range(10).filter(lambda x: x % 3 == 0)"),
    Case("filter_all_false", "ds = D.range(5).filter(lambda x: x > 100)"),
    Case("filter_tuple_args", "ds = D.zip((D.range(6), D.range(6).map(lambda x: x % 3))).filter(lambda i, m: m == 0)"),
    Case("filter_dict", "ds = D.from_tensor_slices({'k': np.arange(6), 'v': np.arange(6) * 2})"
                        ".filter(lambda d: d['v'] > 4)"),
    Case("filter_constant_true", "ds = D.range(3).filter(lambda x: True)"),
    Case("filter_chained", "ds = D.range(20).filter(lambda x: x % 2 == 0).filter(lambda x: x % 3 == 0)"),
    Case("filter_infinite_cardinality", "ds = D.range(5).repeat().filter(lambda x: x < 2)", max_elements=6),
    Case("filter_not_callable", "ds = D.range(3).filter(5)"),
    # --- batch ----------------------------------------------------------------------------------------
    Case("batch_uneven", "ds = D.range(10).batch(3)"),
    Case("batch_drop", "ds = D.range(10).batch(3, drop_remainder=True)"),
    Case("batch_larger_than_input", "ds = D.range(3).batch(10)"),
    Case("batch_larger_than_input_drop", "ds = D.range(3).batch(10, drop_remainder=True)"),
    Case("batch_tuples", "ds = D.zip((D.range(5), D.range(5).map(lambda x: x * 2))).batch(2)"),
    Case("batch_dict", "ds = D.from_tensor_slices({'a': np.arange(5), 'b': np.ones((5, 2), np.float32)}).batch(2)"),
    Case("batch_of_batches", "ds = D.range(8).batch(2).batch(2)"),
    Case("batch_strings", "ds = D.from_tensor_slices(np.array([b'x', b'y', b'z'])).batch(2)"),
    Case("batch_infinite", "ds = D.range(3).repeat().batch(2)", max_elements=4),
    Case("batch_zero", "ds = D.range(3).batch(0)"),
    Case("batch_negative", "ds = D.range(3).batch(-1)"),
    Case("batch_float_size", "ds = D.range(3).batch(1.5)"),
    # --- padded_batch ---------------------------------------------------------------------------------
    Case("padded_batch_default", f"ds = ({_A32}).padded_batch(2)"),
    Case("padded_batch_fixed", f"ds = ({_A32}).padded_batch(2, padded_shapes=5)"),
    Case("padded_batch_fixed_list", f"ds = ({_A32}).padded_batch(3, padded_shapes=[6])"),
    Case("padded_batch_value_int32", f"ds = ({_A32}).padded_batch(2, padded_shapes=5, padding_values=np.int32(-1))"),
    Case("padded_batch_value_literal_int32", f"ds = ({_A32}).padded_batch(2, padding_values=-1)"),
    Case("padded_batch_drop_remainder", f"ds = ({_A32}).padded_batch(3, drop_remainder=True)"),
    Case("padded_batch_drop_remainder_fixed", f"ds = ({_A32}).padded_batch(2, padded_shapes=[4], drop_remainder=True)"),
    Case("padded_batch_none_dimension", f"ds = ({_A64}).padded_batch(2, padded_shapes=[None])"),
    Case("padded_batch_tuple", f"ds = D.zip((({_A32}), ({_A64}))).padded_batch(2, padded_shapes=([4], [None]), "
                               "padding_values=(np.int32(-1), np.int64(100)))"),
    Case("padded_batch_dict", f"ds = D.zip({{'x': ({_A64}), 'y': ({_A32})}}).padded_batch(2, "
                              "padding_values={'x': np.int64(9), 'y': np.int32(8)})"),
    Case("padded_batch_float", f"ds = ({_F64}).padded_batch(2, padding_values=np.float64(-0.5))"),
    Case("padded_batch_float_literal", f"ds = ({_F32}).padded_batch(3, padded_shapes=[4], padding_values=0.25)",
         literal_dtypes=True),
    Case("padded_batch_strings", f"ds = ({_S}).padded_batch(3)"),
    Case("padded_batch_strings_value", f"ds = ({_S}).padded_batch(2, padded_shapes=[3], padding_values=b'-')"),
    Case("padded_batch_scalars", "ds = D.range(5).padded_batch(2)"),
    Case("padded_batch_scalars_empty_shape", "ds = D.range(3).padded_batch(2, padded_shapes=())"),
    Case("padded_batch_matrix", "ds = D.range(1, 4).map(lambda x: (x, x + 1)).padded_batch(2)"),
    Case("padded_batch_float_on_int64", f"ds = ({_A64}).padded_batch(2, padding_values=-1.5)"),
    Case("padded_batch_int32_on_int64", f"ds = ({_A64}).padded_batch(2, padding_values=np.int32(-1))"),
    Case("padded_batch_int64_on_int32", f"ds = ({_A32}).padded_batch(2, padding_values=np.int64(-1))"),
    Case("padded_batch_float32_on_float64", f"ds = ({_F64}).padded_batch(2, padding_values=np.float32(1))"),
    Case("padded_batch_int_on_strings", f"ds = ({_S}).padded_batch(2, padding_values=np.int64(1))"),
    Case("padded_batch_non_scalar_value", f"ds = ({_A64}).padded_batch(2, padding_values=np.array([1, 2]))"),
    Case("padded_batch_shape_too_small", "ds = D.from_tensor_slices(np.arange(4).reshape(2, 2)).padded_batch(2, "
                                         "padded_shapes=[1])"),
    Case("padded_batch_shape_wrong_rank", "ds = D.from_tensor_slices(np.arange(4).reshape(2, 2)).padded_batch(2, "
                                          "padded_shapes=[3, 3])"),
    Case("padded_batch_scalar_padded_to_vector", "ds = D.range(3).padded_batch(2, padded_shapes=[2])"),
    Case("padded_batch_zero", f"ds = ({_A32}).padded_batch(0)"),
    # --- unbatch --------------------------------------------------------------------------------------
    Case("unbatch_known_batch", "ds = D.from_tensors(np.arange(6).reshape(3, 2)).unbatch()"),
    Case("unbatch_batch_drop_remainder", "ds = D.range(6).batch(2, drop_remainder=True).unbatch()"),
    Case("unbatch_batch_uneven", "ds = D.range(7).batch(2).unbatch()"),
    Case("unbatch_repeated", "ds = D.from_tensors(np.zeros((3, 2))).repeat(2).unbatch()"),
    Case("unbatch_tuple", "ds = D.zip((D.from_tensors(np.arange(6).reshape(3, 2)), D.from_tensors(np.arange(3))))"
                          ".unbatch()"),
    Case("unbatch_tuple_one_known", "ds = D.zip((D.from_tensors(np.zeros((3, 2))), D.range(3).batch(3))).unbatch()"),
    Case("unbatch_dict", "ds = D.from_tensors({'a': np.arange(4), 'b': np.ones((4, 2), np.float32)}).unbatch()"),
    Case("unbatch_empty_batch", "ds = D.from_tensors(np.zeros((0, 2))).unbatch()"),
    Case("unbatch_generator", "ds = D.from_generator(lambda: iter([np.arange(n) for n in (3, 1, 2)]), "
                              "output_signature=TensorSpec([None], np.int64)).unbatch()"),
    Case("unbatch_infinite", "ds = D.range(6).batch(2).repeat().unbatch()", max_elements=8),
    Case("unbatch_scalars", "ds = D.range(3).unbatch()"),
    Case("unbatch_mismatched_batch", "ds = D.zip((D.from_tensors(np.zeros((3, 2))), D.from_tensors(np.zeros(4))))"
                                     ".unbatch()"),
    # --- shuffle --------------------------------------------------------------------------------------
    Case("shuffle_seeded", "ds = D.range(30).shuffle(10, seed=7)", unordered=True),
    Case("shuffle_unseeded", "ds = D.range(30).shuffle(100)", unordered=True),
    Case("shuffle_negative_seed", "ds = D.range(10).shuffle(3, seed=-3)", unordered=True),
    Case("shuffle_buffer_one_keeps_order", "ds = D.range(6).shuffle(1)"),
    Case("shuffle_whole_input", "ds = D.range(12).shuffle(-2, seed=1)", unordered=True),
    Case("shuffle_tuples", "ds = D.zip((D.range(8), D.range(8).map(lambda x: x * 2))).shuffle(4, seed=3)",
         unordered=True),
    Case("shuffle_no_reshuffle_same_order",
         "d = D.range(40).shuffle(40, seed=5, reshuffle_each_iteration=False)\n"
         "a, b = list(d.as_numpy_iterator()), list(d.as_numpy_iterator())\n"
         "result = (a == b, sorted(a) == list(range(40)))"),
    Case("shuffle_reshuffle_differs",
         "d = D.range(60).shuffle(60, seed=5, reshuffle_each_iteration=True)\n"
         "a, b = list(d.as_numpy_iterator()), list(d.as_numpy_iterator())\n"
         "result = (a == b, sorted(a) == sorted(b))"),
    Case("shuffle_repeat_epochs_complete",
         "d = D.range(5).shuffle(5, seed=2).repeat(3)\nv = [int(x) for x in d.as_numpy_iterator()]\n"
         "result = [sorted(v[i:i + 5]) for i in (0, 5, 10)]"),
    Case("shuffle_zero", "ds = D.range(3).shuffle(0)"),
    Case("shuffle_minus_one", "ds = D.range(3).shuffle(-1)"),
    Case("shuffle_minus_three", "ds = D.range(3).shuffle(-3)"),
    Case("shuffle_float_seed", "ds = D.range(3).shuffle(3, seed=1.5)"),
    # --- repeat, take, skip ---------------------------------------------------------------------------
    Case("repeat_count", "ds = D.range(3).repeat(2)"),
    Case("repeat_zero", "ds = D.range(3).repeat(0)"),
    Case("repeat_minus_one", "ds = D.range(2).repeat(-1)", max_elements=5),
    Case("repeat_negative", "ds = D.range(2).repeat(-3)", max_elements=5),
    Case("repeat_empty_forever", "ds = D.range(0).repeat()"),
    Case("repeat_empty_negative", "ds = D.range(0).repeat(-7)"),
    Case("take_more_than_all", "ds = D.range(3).take(10)"),
    Case("take_zero", "ds = D.range(3).take(0)"),
    Case("take_minus_one", "ds = D.range(4).take(-1)"),
    # Any negative count takes every element. The cardinality is take_dataset_op.cc's: min(input's, n), n over
    # an infinite input (a negative number that is no count), unknown over an unknown one.
    Case("take_negative_elements", "result = list(D.range(5).take(-3).as_numpy_iterator())"),
    Case("take_negative", "ds = D.range(10).take(-5)"),
    Case("take_negative_infinite", "ds = D.range(3).repeat().take(-7)", max_elements=8),
    Case("take_negative_unknown", "ds = D.range(5).filter(lambda x: True).take(-7)"),
    Case("take_infinite", "ds = D.range(3).repeat().take(7)"),
    Case("skip_some", "ds = D.range(10).skip(4)"),
    Case("skip_more_than_all", "ds = D.range(3).skip(10)"),
    Case("skip_minus_one", "ds = D.range(5).skip(-1)"),
    Case("skip_negative", "ds = D.range(5).skip(-5)"),
    Case("skip_negative_unknown", "ds = D.range(5).filter(lambda x: True).skip(-2)"),
    Case("skip_negative_infinite_yields_nothing", "ds = D.range(5).repeat().skip(-1).take(3)"),
    Case("skip_infinite", "ds = D.range(3).repeat().skip(2).take(4)"),
    Case("take_float", "ds = D.range(3).take(1.5)"),
    Case("take_string", "ds = D.range(3).take('a')"),
    Case("skip_float", "ds = D.range(3).skip(0.5)"),
    Case("repeat_float", "ds = D.range(3).repeat(2.0)"),
    # --- take_while -----------------------------------------------------------------------------------
    Case("take_while", "ds = D.range(10).take_while(lambda x: x < 4)"),
    Case("take_while_never", "ds = D.range(10).take_while(lambda x: x > 4)"),
    Case("take_while_tuple", "ds = D.zip((D.range(10), D.range(10, 20))).take_while(lambda a, b: a + b < 16)"),
    Case("take_while_infinite", "ds = D.range(5).repeat().take_while(lambda x: x < 3)"),
    Case("take_while_not_callable", "ds = D.range(3).take_while(5)"),
    # --- shard ----------------------------------------------------------------------------------------
    Case("shard_first", "ds = D.range(10).shard(3, 0)"),
    Case("shard_last", "ds = D.range(10).shard(3, 2)"),
    Case("shard_more_shards_than_elements", "ds = D.range(2).shard(5, 3)"),
    Case("shard_unknown", "ds = D.range(10).filter(lambda x: True).shard(2, 1)"),
    Case("shard_infinite", "ds = D.range(4).repeat().shard(2, 1)", max_elements=5),
    Case("shard_zero_shards", "ds = D.range(3).shard(0, 0)"),
    Case("shard_index_too_large", "ds = D.range(3).shard(2, 2)"),
    Case("shard_index_negative", "ds = D.range(3).shard(2, -1)"),
    Case("shard_float", "ds = D.range(3).shard(1.5, 0)"),
    # --- enumerate ------------------------------------------------------------------------------------
    Case("enumerate_default", "ds = D.range(3, 6).enumerate()"),
    Case("enumerate_negative_start", "ds = D.range(3).enumerate(-3)"),
    Case("enumerate_tuple", "ds = D.zip((D.range(2), D.range(2))).enumerate(start=10)"),
    Case("enumerate_float_start", "ds = D.range(3).enumerate(start=1.5)"),
    # --- flat_map, interleave -------------------------------------------------------------------------
    Case("flat_map_range", "ds = D.range(4).flat_map(lambda x: D.range(x))"),
    Case("flat_map_tuple_args", "ds = D.zip((D.range(3), D.range(3))).flat_map(lambda a, b: D.range(a + b))"),
    Case("flat_map_from_tensor_slices", "ds = D.from_tensors(np.arange(6).reshape(2, 3))"
                                        ".flat_map(lambda x: D.from_tensor_slices(x))"),
    Case("flat_map_nested_elements", "ds = D.range(1, 4).flat_map(lambda x: D.zip((D.range(x), D.range(x).map("
                                     "lambda y: y * 10))))"),
    Case("flat_map_not_callable", "ds = D.range(3).flat_map(5)"),
    Case("interleave_cycle_2_block_1", "ds = D.range(1, 4).interleave(lambda x: D.from_tensors(x).repeat(3), "
                                       "cycle_length=2)"),
    Case("interleave_cycle_3_block_2", "ds = D.range(5).interleave(lambda x: D.range(x * 10, x * 10 + 4), "
                                       "cycle_length=3, block_length=2)"),
    Case("interleave_cycle_1", "ds = D.range(4).interleave(lambda x: D.range(x), cycle_length=1)"),
    Case("interleave_block_larger", "ds = D.range(3).interleave(lambda x: D.range(x * 10, x * 10 + 3), "
                                    "cycle_length=2, block_length=5)"),
    Case("interleave_uneven_inputs", "ds = D.range(1, 6).interleave(lambda x: D.from_tensors(x).repeat(x), "
                                     "cycle_length=3, block_length=2)"),
    Case("interleave_cycle_longer_than_input", "ds = D.range(2).interleave(lambda x: D.range(x * 5, x * 5 + 3), "
                                               "cycle_length=8)"),
    Case("interleave_parallel_deterministic",
         "ds = D.range(1, 6).interleave(lambda x: D.from_tensors(x).repeat(6), cycle_length=2, block_length=4, "
         "num_parallel_calls=2, deterministic=True)"),
    Case("interleave_parallel_autotune",
         "ds = D.range(4).interleave(lambda x: D.range(x * 10, x * 10 + 3), cycle_length=2, "
         "num_parallel_calls=AUTOTUNE)"),
    Case("interleave_parallel_nondeterministic",
         "ds = D.range(6).interleave(lambda x: D.range(x * 10, x * 10 + 5), cycle_length=3, block_length=2, "
         "num_parallel_calls=3, deterministic=False)", unordered=True),
    Case("interleave_autotune_cycle_unordered",
         "ds = D.range(5).interleave(lambda x: D.range(x * 10, x * 10 + 2))", unordered=True),
    Case("interleave_cycle_zero", "ds = D.range(3).interleave(lambda x: D.range(x), cycle_length=0)"),
    Case("interleave_cycle_negative", "ds = D.range(3).interleave(lambda x: D.range(x), cycle_length=-5)"),
    Case("interleave_block_zero", "ds = D.range(3).interleave(lambda x: D.range(x), cycle_length=2, block_length=0)"),
    Case("interleave_parallel_zero", "ds = D.range(3).interleave(lambda x: D.range(x), cycle_length=2, "
                                     "num_parallel_calls=0)"),
    Case("interleave_not_callable", "ds = D.range(3).interleave(5)"),
    # --- prefetch -------------------------------------------------------------------------------------
    Case("prefetch_one", "ds = D.range(5).prefetch(1)"),
    Case("prefetch_zero", "ds = D.range(5).prefetch(0)"),
    Case("prefetch_autotune", "ds = D.range(5).map(lambda x: x * 2).prefetch(AUTOTUNE)"),
    Case("prefetch_large", "ds = D.range(5).prefetch(100)"),
    Case("prefetch_infinite", "ds = D.range(2).repeat().prefetch(3)", max_elements=5),
    Case("prefetch_negative", "ds = D.range(3).prefetch(-5)"),
    Case("prefetch_float", "ds = D.range(3).prefetch(1.5)"),
    # --- cache ----------------------------------------------------------------------------------------
    Case("cache_memory_twice",
         "d = D.range(5).map(lambda x: x ** 2).cache()\n"
         "result = (list(d.as_numpy_iterator()), list(d.as_numpy_iterator()))"),
    Case("cache_memory_partial_then_full",
         "d = D.range(6).cache()\nfirst = list(d.take(2).as_numpy_iterator())\n"
         "result = (first, list(d.as_numpy_iterator()))"),
    Case("cache_memory_cardinality", "ds = D.range(4).cache()"),
    Case("cache_file",
         "ds = D.range(5).map(lambda x: x * 3).cache(tmp + 'cache')\nfirst = list(ds.as_numpy_iterator())\n"
         "ds = D.range(10).cache(tmp + 'cache')"),
    Case("cache_file_second_pass",
         "d = D.range(4).cache(tmp + 'c2')\nresult = (list(d.as_numpy_iterator()), list(d.as_numpy_iterator()))"),
    Case("cache_then_shuffle", "ds = D.range(8).cache().shuffle(8, seed=1)", unordered=True),
    Case("cache_filename_not_string", "ds = D.range(3).cache(5)"),
    # --- concatenate ----------------------------------------------------------------------------------
    Case("concatenate", "ds = D.range(1, 4).concatenate(D.range(4, 8))"),
    Case("concatenate_tuples", "ds = D.zip((D.range(2), D.range(2))).concatenate(D.zip((D.range(5, 7), "
                               "D.range(7, 9))))"),
    Case("concatenate_dicts", "ds = D.from_tensor_slices({'a': np.arange(2)}).concatenate("
                              "D.from_tensor_slices({'a': np.arange(5, 8)}))"),
    Case("concatenate_shapes_relax", "ds = D.range(5).batch(2, drop_remainder=True).concatenate(D.range(3).batch(3))"),
    Case("concatenate_ranks_differ", "ds = D.range(3).batch(2).concatenate(D.range(3))"),
    Case("concatenate_empty", "ds = D.range(0).concatenate(D.range(3))"),
    Case("concatenate_infinite", "ds = D.range(2).repeat().concatenate(D.range(3))", max_elements=5),
    Case("concatenate_unknown", "ds = D.range(4).filter(lambda x: x > 1).concatenate(D.range(2))"),
    Case("concatenate_int64_with_tuple", "ds = D.range(3).concatenate(D.zip((D.range(2), D.range(2))))"),
    Case("concatenate_int64_with_strings", "ds = D.range(3).concatenate(D.from_tensor_slices(np.array([b'a'])))"),
    Case("concatenate_int64_with_int32", "ds = D.range(3).concatenate(D.from_tensor_slices(np.arange(2, "
                                         "dtype=np.int32)))"),
    Case("concatenate_dict_keys_differ", "ds = D.from_tensor_slices({'a': np.arange(2)}).concatenate("
                                         "D.from_tensor_slices({'b': np.arange(2)}))"),
    Case("concatenate_tuple_lengths_differ", "ds = D.zip((D.range(2), D.range(2))).concatenate("
                                             "D.zip((D.range(2), D.range(2), D.range(2))))"),
    # --- zip ------------------------------------------------------------------------------------------
    Case("zip_pair", "ds = D.zip((D.range(3), D.range(3, 6)))"),
    Case("zip_varargs", "ds = D.zip(D.range(2), D.range(3), D.range(1, 9))"),
    Case("zip_single", "ds = D.zip(D.range(3))"),
    Case("zip_one_tuple", "ds = D.zip((D.range(3),))"),
    Case("zip_datasets_keyword", "ds = D.zip(datasets=(D.range(2), D.range(3)))"),
    Case("zip_nested_dict", "ds = D.zip({'a': D.range(2), 'b': (D.range(3), D.range(10, 14))})"),
    Case("zip_nested_tuple", "ds = D.zip((D.range(3), (D.range(3), D.range(3).batch(1))))"),
    Case("zip_infinite_with_finite", "ds = D.zip((D.range(2).repeat(), D.range(5)))"),
    Case("zip_unknown", "ds = D.zip((D.range(4).filter(lambda x: True), D.range(2)))"),
    Case("zip_no_argument", "ds = D.zip()"),
    Case("zip_empty_tuple", "ds = D.zip(())"),
    Case("zip_list", "ds = D.zip([D.range(2), D.range(3)])"),
    Case("zip_not_dataset", "ds = D.zip((D.range(2), 1))"),
    Case("zip_int", "ds = D.zip(1)"),
    Case("zip_both_forms", "ds = D.zip(D.range(2), datasets=D.range(3))"),
    # --- reduce, apply --------------------------------------------------------------------------------
    Case("reduce_sum", "result = D.range(5).reduce(np.int64(0), lambda s, x: s + x)"),
    Case("reduce_count", "result = D.range(7).reduce(np.int64(0), lambda s, _: s + 1)"),
    Case("reduce_tuple_state", "result = D.range(1, 5).reduce((np.int64(0), np.int64(1)), "
                               "lambda s, x: (s[0] + x, s[1] * x))"),
    Case("reduce_empty", "result = D.range(0).reduce(np.int64(42), lambda s, x: s + x)"),
    Case("reduce_tuple_elements", "result = D.zip((D.range(3), D.range(3))).reduce(np.int64(0), "
                                  "lambda s, e: s + e[0] * e[1])"),
    Case("reduce_not_callable", "result = D.range(3).reduce(np.int64(0), 5)"),
    Case("apply", "ds = D.range(10).apply(lambda d: d.filter(lambda x: x % 4 == 0))"),
    Case("apply_chain", "ds = D.range(6).apply(lambda d: d.batch(2)).apply(lambda d: d.unbatch())"),
    Case("apply_not_dataset", "ds = D.range(3).apply(lambda d: 5)"),
    Case("apply_not_callable", "ds = D.range(3).apply(5)"),
    # --- unique ---------------------------------------------------------------------------------------
    Case("unique_ints", "ds = D.from_tensor_slices(np.array([1, 37, 2, 37, 2, 1], np.int64)).unique()"),
    Case("unique_int32", "ds = D.from_tensor_slices(np.array([3, 3, 1], np.int32)).unique()"),
    Case("unique_strings", "ds = D.from_tensor_slices(np.array([b'b', b'a', b'b', b'c', b'a'])).unique()"),
    Case("unique_repeated", "ds = D.range(3).repeat(3).unique()"),
    Case("unique_vectors", "ds = D.from_tensor_slices(np.array([[1, 2], [1, 2], [2, 1], [1, 2]])).unique()"),
    Case("unique_string_vectors", "ds = D.from_tensor_slices(np.array([[b'a', b'b'], [b'a', b'b'], "
                                  "[b'b', b'a']])).unique()"),
    Case("unique_floats", "ds = D.from_tensor_slices(np.ones(4)).unique()"),
    Case("unique_float_matrices", "ds = D.from_tensor_slices(np.ones((4, 2, 2))).unique()"),
    Case("unique_bools", "ds = D.from_tensor_slices(np.array([True, False])).unique()"),
    Case("unique_int16", "ds = D.from_tensor_slices(np.array([1, 2], np.int16)).unique()"),
    Case("unique_tuples", "ds = D.zip((D.range(3), D.range(3))).unique()"),
    # --- combinations ---------------------------------------------------------------------------------
    Case("pipeline_shard_map_batch", "ds = D.range(40).shard(4, 1).map(lambda x: x * 2).batch(3, drop_remainder=True)"),
    Case("pipeline_shuffle_batch_sizes",
         "d = D.range(40).shuffle(8, seed=1).batch(6)\nresult = [len(b) for b in d.as_numpy_iterator()]"),
    Case("pipeline_enumerate_filter_map", "ds = D.range(10, 20).enumerate().filter(lambda i, x: i % 3 == 0)"
                                          ".map(lambda i, x: x - i)"),
    Case("pipeline_repeat_batch_take", "ds = D.range(5).repeat(3).batch(4).take(3)"),
    Case("pipeline_skip_take_repeat", "ds = D.range(10).skip(3).take(4).repeat(2)"),
    Case("pipeline_interleave_batch", "ds = D.range(3).interleave(lambda x: D.range(x, x + 4), cycle_length=3)"
                                      ".batch(5)"),
]

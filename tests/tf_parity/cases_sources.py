"""Sources: range, from_tensors, from_tensor_slices, from_generator, list_files, the file readers and
TFRecordWriter, with the reference documentation's examples (issue 16, helper D)."""

from tests.tf_parity.case import Case

# A file of TFRecords the reader cases read: written by the dataset writer on each side.
_RECORDS = "TFRecordWriter(tmp + 'a.tfrecord').write(D.from_tensor_slices([b'first', b'second', b'third']))\n"
# Two text files and a binary one, written with plain Python.
_TEXT = ("open(tmp + 'a.txt', 'wb').write(b'one\\ntwo\\n\\nthree')\n"
         "open(tmp + 'b.txt', 'wb').write(b'four\\r\\nfive\\n')\n")

CASES = [
    # --- range: the documented examples ------------------------------------------------------
    Case("range_doc_stop", "result = list(D.range(5).as_numpy_iterator())"),
    Case("range_doc_start_stop", "result = list(D.range(2, 5).as_numpy_iterator())"),
    Case("range_doc_step", "result = list(D.range(1, 5, 2).as_numpy_iterator())"),
    Case("range_doc_negative_step_empty", "ds = D.range(1, 5, -2)"),
    Case("range_doc_stop_below_start", "ds = D.range(5, 1)"),
    Case("range_doc_negative_step", "ds = D.range(5, 1, -2)"),
    Case("range_doc_output_type_int32", "ds = D.range(2, 5, output_type=np.int32)"),
    Case("range_doc_output_type_float32", "ds = D.range(1, 5, 2, output_type=np.float32)"),
    Case("range_output_type_uint8", "ds = D.range(3, output_type=np.uint8)"),
    Case("range_output_type_int8_wraps", "ds = D.range(250, 260, output_type=np.int8)"),
    Case("range_output_type_float64", "ds = D.range(-2, 2, output_type=np.float64)"),
    Case("range_output_type_batch", "ds = D.range(1, 5, output_type=np.int32).batch(2)"),
    Case("range_no_argument", "ds = D.range()"),
    Case("range_four_arguments", "ds = D.range(1, 2, 3, 4)"),
    Case("range_float_argument", "ds = D.range(1.5)"),
    Case("range_string_argument", "ds = D.range('3')"),
    Case("range_none_argument", "ds = D.range(None)"),
    Case("range_numpy_arguments", "ds = D.range(np.int32(1), np.array(7), np.int64(2))"),
    Case("range_bool_argument", "ds = D.range(True)"),
    Case("range_step_zero", "ds = D.range(0, 10, 0)"),
    Case("range_large_cardinality", "result = int(D.range(2 ** 40).cardinality())"),
    # --- from_tensors / from_tensor_slices ------------------------------------------------------
    Case("from_tensors_doc", "ds = D.from_tensors([1, 2, 3])", literal_dtypes=True),
    Case("from_tensors_tuple_doc", "ds = D.from_tensors(([1, 2, 3], 'A'))", literal_dtypes=True),
    Case("from_tensors_array", "ds = D.from_tensors(np.arange(6, dtype=np.int32).reshape(2, 3))"),
    Case("from_tensors_dict", "ds = D.from_tensors({'a': np.float32(1.5), 'b': np.array([b'x', b'y'])})"),
    Case("from_tensor_slices_doc_list", "ds = D.from_tensor_slices([1, 2, 3])", literal_dtypes=True),
    Case("from_tensor_slices_doc_nested", "ds = D.from_tensor_slices([[1, 2], [3, 4]])", literal_dtypes=True),
    Case("from_tensor_slices_doc_tuple", "ds = D.from_tensor_slices(([1, 2], [3, 4], [5, 6]))",
         literal_dtypes=True),
    Case("from_tensor_slices_doc_features_labels",
         "features = np.array([[1, 3], [2, 1], [3, 3]], np.int32)\nlabels = np.array(['A', 'B', 'A'])\n"
         "ds = D.from_tensor_slices((features, labels))"),
    Case("from_tensor_slices_doc_dict",
         "ds = D.from_tensor_slices({'a': np.array([1, 2], np.int64), 'b': np.array([3., 4.], np.float32)})"),
    Case("from_tensor_slices_scalar", "ds = D.from_tensor_slices(np.int64(3))"),
    Case("from_tensor_slices_uneven", "ds = D.from_tensor_slices((np.arange(3), np.arange(4)))"),
    Case("from_tensor_slices_empty", "ds = D.from_tensor_slices(np.zeros((0, 2), np.float32))"),
    # --- from_generator: output_types, output_shapes, output_signature, args --------------------
    Case("generator_doc_map_tuple",
         "elements = [(1, 'foo'), (2, 'bar'), (3, 'baz')]\n"
         "ds = D.from_generator(lambda: elements, (np.int32, 'string'))\n"
         "result = list(ds.map(lambda x_int, y_str: x_int).as_numpy_iterator())"),
    Case("generator_doc_map_dict",
         "elements = [{'a': 1, 'b': 'foo'}, {'a': 2, 'b': 'bar'}, {'a': 3, 'b': 'baz'}]\n"
         "ds = D.from_generator(lambda: elements, {'a': np.int32, 'b': 'string'})"),
    Case("generator_doc_unbatch",
         "elements = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]\n"
         "ds = D.from_generator(lambda: elements, np.int64).unbatch()"),
    Case("generator_doc_padded_batch",
         "elements = [([1, 2, 3], [10]), ([4, 5], [11, 12])]\n"
         "ds = D.from_generator(lambda: iter(elements), (np.int32, np.int32))\n"
         "ds = ds.padded_batch(2, padded_shapes=([4], [None]), padding_values=(np.int32(-1), np.int32(100)))"),
    Case("generator_signature", "ds = D.from_generator(lambda: iter([1, 2]), output_signature=TensorSpec((), np.int32))"),
    Case("generator_signature_tuple",
         "def gen():\n    yield 42, [1.5, 2.5]\n    yield 7, [3.5]\n"
         "ds = D.from_generator(gen, output_signature=(TensorSpec((), np.int32), TensorSpec((None,), np.float32)))"),
    Case("generator_types_cast_int32", "ds = D.from_generator(lambda: iter([1, 2]), np.int32)"),
    Case("generator_types_cast_float32", "ds = D.from_generator(lambda: iter([1, 2]), np.float32)"),
    Case("generator_types_int32_from_numpy_float", "ds = D.from_generator(lambda: iter([np.float64(1.5)]), np.int32)"),
    Case("generator_types_int32_from_float_array",
         "ds = D.from_generator(lambda: iter([np.array([1.5, 2.5])]), np.int32)"),
    Case("generator_types_int32_from_python_float", "ds = D.from_generator(lambda: iter([1.5]), np.int32)"),
    Case("generator_types_bool_from_python_int", "ds = D.from_generator(lambda: iter([0, 2]), np.bool_)"),
    Case("generator_types_int_from_python_bool", "ds = D.from_generator(lambda: iter([True]), np.int32)"),
    Case("generator_types_int_from_string", "ds = D.from_generator(lambda: iter(['a']), np.int32)"),
    Case("generator_types_string_from_int", "ds = D.from_generator(lambda: iter([1]), 'string')"),
    Case("generator_types_none", "ds = D.from_generator(lambda: iter([None]), np.int32)"),
    Case("generator_types_mixed_list_to_int", "ds = D.from_generator(lambda: iter([[1, 2.0]]), np.int32)"),
    Case("generator_types_uint8_wraps", "ds = D.from_generator(lambda: iter([-1]), np.uint8)"),
    Case("generator_types_scalar_spec_gets_tuple", "ds = D.from_generator(lambda: iter([(1, 2)]), np.int32)"),
    Case("generator_types_tuple_wrong_arity", "ds = D.from_generator(lambda: iter([(1, 2, 3)]), (np.int32, np.int32))"),
    Case("generator_types_tuple_gets_list", "ds = D.from_generator(lambda: iter([[1, 2]]), (np.int32, np.int32))"),
    Case("generator_types_tuple_gets_scalar", "ds = D.from_generator(lambda: iter([1]), (np.int32, np.int32))"),
    Case("generator_types_dict_missing_key",
         "ds = D.from_generator(lambda: iter([{'a': 1}]), {'a': np.int32, 'b': 'string'})"),
    Case("generator_types_nested", "ds = D.from_generator(lambda: iter([(1, (2, 3))]), (np.int32, (np.int32, np.int64)))"),
    Case("generator_shapes", "ds = D.from_generator(lambda: iter([[1, 2], [3, 4]]), np.int32, [2])"),
    Case("generator_shapes_none_dim", "ds = D.from_generator(lambda: iter([[1, 2], [3, 4, 5]]), np.int32, [None])"),
    Case("generator_shapes_mismatch", "ds = D.from_generator(lambda: iter([[1, 2], [3, 4, 5]]), np.int32, [2])"),
    Case("generator_shapes_rank_mismatch", "ds = D.from_generator(lambda: iter([1]), np.int32, [2])"),
    Case("generator_shapes_tuple", "ds = D.from_generator(lambda: iter([(1, [2, 3])]), (np.int32, np.int32), ((), (2,)))"),
    Case("generator_shapes_structure_mismatch",
         "ds = D.from_generator(lambda: iter([(1, 2)]), (np.int32, np.int32), ((),))"),
    Case("generator_shapes_without_types", "ds = D.from_generator(lambda: iter([1]), output_shapes=[2])"),
    Case("generator_known_shape_casts_float_to_int",
         "ds = D.from_generator(lambda: iter([1.7, 2.2]), output_signature=TensorSpec((), np.int32))"),
    Case("generator_known_shape_parses_string",
         "ds = D.from_generator(lambda: iter([('4', 'x')]), (np.int32, 'string'))"),
    Case("generator_known_shape_bad_string",
         "ds = D.from_generator(lambda: iter(['a']), output_signature=TensorSpec((), np.int32))"),
    Case("generator_signature_shape_mismatch",
         "ds = D.from_generator(lambda: iter([[1, 2, 3]]), output_signature=TensorSpec((2,), np.int32))"),
    Case("generator_signature_unknown_rank",
         "ds = D.from_generator(lambda: iter([[1, 2, 3], [4]]), output_signature=TensorSpec(None, np.int32))"),
    Case("generator_signature_and_types",
         "ds = D.from_generator(lambda: iter([1]), np.int32, output_signature=TensorSpec((), np.int32))"),
    Case("generator_signature_not_specs", "ds = D.from_generator(lambda: iter([1]), output_signature=np.int32)"),
    Case("generator_signature_list", "ds = D.from_generator(lambda: iter([(1, 2)]), "
                                     "output_signature=[TensorSpec((), np.int32), TensorSpec((), np.int32)])"),
    Case("generator_not_callable", "ds = D.from_generator([1, 2], np.int32)"),
    Case("generator_args", "ds = D.from_generator(lambda n: iter(range(n)), np.int64, args=(3,))"),
    Case("generator_args_list", "ds = D.from_generator(lambda a, b: iter([a, b]), np.int64, args=[3, 4])"),
    Case("generator_args_array", "ds = D.from_generator(lambda a: iter(a), np.int64, args=(np.array([4, 5]),))"),
    Case("generator_args_string", "ds = D.from_generator(lambda s: iter([s, s]), 'string', args=('x',))"),
    Case("generator_args_are_numpy",
         "ds = D.from_generator(lambda a: iter([type(a).__module__ == 'numpy']), np.bool_, args=(3,))"),
    Case("generator_args_not_a_sequence", "ds = D.from_generator(lambda a: iter([a]), np.int64, args=3)"),
    Case("generator_args_none", "ds = D.from_generator(lambda a: iter([a]), np.int64, args=(None,))"),
    Case("generator_repeat", "ds = D.from_generator(lambda: iter([1, 2]), np.int64).repeat(2)"),
    Case("generator_cardinality", "result = int(D.from_generator(lambda: iter([1]), np.int64).cardinality())"),
    # --- list_files (deterministic: shuffle=False) ----------------------------------------------
    Case("list_files_sorted",
         "import os\nfor n in ['b.txt', 'a.txt', 'c.py', 'a.py']:\n    open(tmp + n, 'w').close()\n"
         "result = [os.path.basename(os.fsdecode(f)) for f in "
         "D.list_files([tmp + '*.txt', tmp + 'a.*'], shuffle=False).as_numpy_iterator()]"),
    Case("list_files_count", _TEXT + "result = int(D.list_files([tmp + '*.txt', tmp + 'a.*'], shuffle=False).cardinality())"),
    Case("list_files_read", _TEXT + "ds = D.list_files(tmp + '*.txt', shuffle=False).interleave(TextLineDataset, cycle_length=1)"),
    # --- TFRecordDataset / TFRecordWriter -------------------------------------------------------
    Case("tfrecord_round_trip", _RECORDS + "ds = TFRecordDataset(tmp + 'a.tfrecord')"),
    Case("tfrecord_round_trip_gzip",
         "TFRecordWriter(tmp + 'g', 'GZIP').write(D.from_tensor_slices([b'x', b'yz']))\n"
         "ds = TFRecordDataset(tmp + 'g', compression_type='GZIP')"),
    Case("tfrecord_round_trip_zlib",
         "TFRecordWriter(tmp + 'z', compression_type='ZLIB').write(D.from_tensor_slices([b'x', b'yz']))\n"
         "ds = TFRecordDataset([tmp + 'z'], compression_type='ZLIB')"),
    Case("tfrecord_writer_strings",
         "TFRecordWriter(tmp + 's').write(D.from_tensor_slices(['a', 'bc']))\nds = TFRecordDataset(tmp + 's')"),
    Case("tfrecord_writer_mapped",
         "TFRecordWriter(tmp + 'm').write(D.range(3).map(lambda x: b'r'))\nds = TFRecordDataset(tmp + 'm')"),
    Case("tfrecord_writer_overwrites",
         _RECORDS + "TFRecordWriter(tmp + 'a.tfrecord').write(D.from_tensor_slices([b'only']))\n"
         "ds = TFRecordDataset(tmp + 'a.tfrecord')"),
    Case("tfrecord_writer_empty_dataset",
         "TFRecordWriter(tmp + 'e').write(D.from_tensor_slices([b'a']).take(0))\nds = TFRecordDataset(tmp + 'e')"),
    Case("tfrecord_writer_generator_unknown_shape",
         "TFRecordWriter(tmp + 'u').write(D.from_generator(lambda: iter([b'x', b'y']), "
         "output_signature=TensorSpec(None, 'string')))\nds = TFRecordDataset(tmp + 'u')"),
    Case("tfrecord_writer_ints", "TFRecordWriter(tmp + 'i').write(D.range(3))"),
    Case("tfrecord_writer_vectors", "TFRecordWriter(tmp + 'v').write(D.from_tensor_slices([[b'a'], [b'b']]))"),
    Case("tfrecord_writer_not_a_dataset_list", "TFRecordWriter(tmp + 'l').write([b'abc'])"),
    Case("tfrecord_several_files",
         _RECORDS + "TFRecordWriter(tmp + 'b').write(D.from_tensor_slices([b'fourth']))\n"
         "ds = TFRecordDataset([tmp + 'a.tfrecord', tmp + 'b'])"),
    Case("tfrecord_dataset_of_filenames",
         _RECORDS + "ds = TFRecordDataset(D.from_tensor_slices([tmp + 'a.tfrecord', tmp + 'a.tfrecord']))"),
    Case("tfrecord_num_parallel_reads",
         _RECORDS + "TFRecordWriter(tmp + 'b').write(D.from_tensor_slices([b'x', b'y', b'z', b'w']))\n"
         "ds = TFRecordDataset([tmp + 'a.tfrecord', tmp + 'b'], num_parallel_reads=2)"),
    Case("tfrecord_interleave", _RECORDS +
         "ds = D.from_tensor_slices([tmp + 'a.tfrecord'] * 2).interleave(TFRecordDataset, cycle_length=2)"),
    Case("tfrecord_no_files", "ds = TFRecordDataset([])"),
    Case("tfrecord_int_filenames", "ds = TFRecordDataset(5)"),
    # --- TextLineDataset --------------------------------------------------------------------------
    Case("text_lines", _TEXT + "ds = TextLineDataset([tmp + 'a.txt', tmp + 'b.txt'])"),
    Case("text_lines_parallel", _TEXT + "ds = TextLineDataset([tmp + 'a.txt', tmp + 'b.txt'], num_parallel_reads=2)"),
    Case("text_lines_no_files", "ds = TextLineDataset([])"),
    # --- FixedLengthRecordDataset -----------------------------------------------------------------
    Case("fixed_length", "open(tmp + 'f', 'wb').write(b'aabbcc')\nds = FixedLengthRecordDataset(tmp + 'f', 2)"),
    Case("fixed_length_header_footer",
         "open(tmp + 'f', 'wb').write(b'HHaabbccF')\nds = FixedLengthRecordDataset(tmp + 'f', 2, 2, 1)"),
    Case("fixed_length_bad_body", "open(tmp + 'f', 'wb').write(b'aabbc')\nds = FixedLengthRecordDataset(tmp + 'f', 2)"),
    Case("fixed_length_bad_body_header_footer",
         "open(tmp + 'f', 'wb').write(b'HHaabbcF')\nds = FixedLengthRecordDataset(tmp + 'f', 2, 2, 1)"),
    Case("fixed_length_shorter_than_header",
         "open(tmp + 'f', 'wb').write(b'HH')\nds = FixedLengthRecordDataset(tmp + 'f', 2, 2, 1)"),
    Case("fixed_length_empty_file", "open(tmp + 'f', 'wb').close()\nds = FixedLengthRecordDataset(tmp + 'f', 2)"),
    Case("fixed_length_float_size", "ds = FixedLengthRecordDataset(tmp + 'f', 1.5)"),
    Case("fixed_length_no_files", "ds = FixedLengthRecordDataset([], 4)"),
]

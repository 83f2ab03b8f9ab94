"""The iterator API: ``iter(ds)``, ``get_next()`` (OutOfRangeError at the end), ``get_next_as_optional()``
and its Optional, ``element_spec``; the reference documentation's tf.data.Iterator examples."""

from tests.tf_parity.case import Case


def _catching(body: str, setup: str = "") -> str:
    """A case that records the class name of the error ``body`` raises (or 'no error')."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"{setup}try:\n{indented}\n    caught = 'no error'\nexcept Exception as e:\n    caught = type(e).__name__\n"


CASES = [
    # --- the reference documentation's examples ---------------------------------------------------
    Case("doc_for_loop", "dataset = D.range(2)\nresult = [element for element in dataset]"),
    Case("doc_get_next", "dataset = D.range(2)\niterator = iter(dataset)\n"
         "result = [iterator.get_next(), iterator.get_next()]"),
    Case("doc_get_next_as_optional", "dataset = D.from_tensors(42)\niterator = iter(dataset)\n"
         "optional = iterator.get_next_as_optional()\nfirst = optional.has_value()\n"
         "optional = iterator.get_next_as_optional()\nresult = (first, optional.has_value())", literal_dtypes=True),
    Case("doc_get_next_as_optional_value", "dataset = D.from_tensors(42)\niterator = iter(dataset)\n"
         "optional = iterator.get_next_as_optional()\n"
         "result = (optional.has_value(), optional.get_value(), iterator.get_next_as_optional().has_value())",
         literal_dtypes=True),
    Case("doc_element_spec", "dataset = D.from_tensors(42)\niterator = iter(dataset)\n"
         "result = iterator.element_spec == dataset.element_spec"),
    Case("doc_element_spec_int32", "iterator = iter(D.from_tensors(np.int32(42)))\ns = iterator.element_spec\n"
         "result = (list(s.shape), s.dtype.name)"),
    Case("doc_get_next_single", "iterator = iter(D.from_tensors(np.int32(42)))\nresult = iterator.get_next()"),

    # --- get_next and the end ---------------------------------------------------------------------
    Case("get_next_then_out_of_range",
         _catching("out.append(it.get_next())\nout.append(it.get_next())\nout.append(it.get_next())",
                   "it = iter(D.range(2))\nout = []\n") + "result = (out, caught)"),
    Case("get_next_out_of_range_repeatedly",
         "it = iter(D.range(1))\nfirst = it.get_next()\nnames = []\nfor _ in range(3):\n"
         "    try:\n        it.get_next()\n    except errors.OutOfRangeError as e:\n"
         "        names.append(type(e).__name__)\nresult = (first, names)"),
    Case("get_next_empty_dataset", _catching("iter(D.range(0)).get_next()") + "result = caught"),
    Case("next_at_end_is_stop_iteration", _catching("next(it)", "it = iter(D.range(0))\n") + "result = caught"),
    Case("next_and_get_next_mixed", "it = iter(D.range(5))\n"
         "result = [next(it), it.get_next(), next(it), it.get_next()]"),
    Case("for_loop_after_get_next", "it = iter(D.range(5))\nfirst = it.get_next()\nresult = (first, [x for x in it])"),
    Case("list_of_exhausted_iterator", "it = iter(D.range(2))\na = list(it)\nresult = (a, list(it))"),
    Case("two_iterators_independent", "dataset = D.range(3)\na, b = iter(dataset), iter(dataset)\n"
         "result = [a.get_next(), a.get_next(), b.get_next()]"),
    Case("get_next_tuple", "it = iter(D.from_tensor_slices((np.arange(3), np.array([b'x', b'y', b'z']))))\n"
         "result = [it.get_next(), it.get_next()]"),
    Case("get_next_dict", "it = iter(D.from_tensor_slices({'a': np.arange(4, dtype=np.int64), "
         "'b': np.ones((4, 2), np.float32)}).batch(3))\nresult = [it.get_next(), it.get_next()]"),
    Case("get_next_window", "it = iter(D.range(5).window(2))\nw = it.get_next()\n"
         "result = (list(w.as_numpy_iterator()), list(it.get_next().as_numpy_iterator()))"),
    Case("get_next_map_end", _catching("it.get_next()", "it = iter(D.range(3).map(lambda x: x // 1))\n"
                                       "vals = [it.get_next() for _ in range(3)]\n") + "result = (vals, caught)"),

    # --- get_next_as_optional ---------------------------------------------------------------------
    Case("optional_sequence", "it = iter(D.range(3))\nout = []\nwhile True:\n    opt = it.get_next_as_optional()\n"
         "    if not opt.has_value():\n        break\n    out.append(opt.get_value())\nresult = out"),
    Case("optional_exhausted_stays_empty", "it = iter(D.range(1))\nit.get_next()\n"
         "result = [it.get_next_as_optional().has_value() for _ in range(3)]"),
    Case("optional_get_value_empty", _catching("opt.get_value()", "it = iter(D.range(0))\n"
                                                "opt = it.get_next_as_optional()\n") + "result = caught"),
    Case("optional_empty_element_spec", "it = iter(D.range(0).batch(2))\nopt = it.get_next_as_optional()\n"
         "s = opt.element_spec\nresult = (opt.has_value(), list(s.shape), s.dtype.name)"),
    Case("optional_value_element_spec", "it = iter(D.range(5).batch(2))\nopt = it.get_next_as_optional()\n"
         "s = opt.element_spec\nresult = (list(s.shape), s.dtype.name, opt.get_value())"),
    Case("optional_nested_value", "it = iter(D.from_tensor_slices({'a': np.arange(2), 'b': (np.arange(2) * 2, "
         "np.array([b'p', b'q']))}))\nresult = [it.get_next_as_optional().get_value() for _ in range(2)]"),
    Case("optional_then_get_next", "it = iter(D.range(3))\nopt = it.get_next_as_optional()\n"
         "result = (opt.get_value(), it.get_next(), [x for x in it])"),
    Case("optional_from_value", "opt = experimental.Optional.from_value((np.int64(3), np.float32(1.5)))\n"
         "s = opt.element_spec\nresult = (opt.has_value(), opt.get_value(), [x.dtype.name for x in s])"),
    Case("optional_empty", "opt = experimental.Optional.empty(TensorSpec((), np.int64))\n"
         + _catching("opt.get_value()") + "result = (opt.has_value(), caught)"),

    # --- element_spec -------------------------------------------------------------------------------
    Case("iterator_element_spec_nested", "dataset = D.from_tensor_slices((np.zeros((4, 3), np.float32), "
         "np.arange(4))).batch(2, drop_remainder=True)\nit = iter(dataset)\ns = it.element_spec\n"
         "result = ([list(x.shape) for x in s], [x.dtype.name for x in s], s == dataset.element_spec)"),
    Case("iterator_element_spec_window", "it = iter(D.range(4).window(2))\ns = it.element_spec\n"
         "result = (list(s.element_spec.shape), s.element_spec.dtype.name)"),
]

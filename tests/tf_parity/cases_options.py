"""Options: the spellings of the documented examples, merge, equality, and options observed in effect
(issue 16, helper D)."""

from tests.tf_parity.case import Case

CASES = [
    Case("options_doc_with_options",
         "ds = D.range(42)\noptions = Options()\noptions.experimental_deterministic = False\n"
         "ds = ds.with_options(options)\nresult = (ds.options().experimental_deterministic, ds.options().deterministic)"),
    Case("options_doc_mutating_options_raises",
         "ds = D.range(42)\nds.options().experimental_deterministic = False"),
    Case("options_mutating_threading_of_options_raises",
         "ds = D.range(42)\nds.options().threading.private_threadpool_size = 2"),
    Case("options_doc_interleave_nondeterministic",
         "ds = D.range(5).interleave(lambda x: D.range(5), cycle_length=3, num_parallel_calls=3)\n"
         "options = Options()\noptions.experimental_deterministic = False\nds = ds.with_options(options)",
         unordered=True),
    Case("options_nondeterministic_map",
         "o = Options()\no.deterministic = False\n"
         "ds = D.range(50).map(lambda x: x * 2, num_parallel_calls=4).with_options(o)", unordered=True),
    Case("options_deterministic_true_keeps_order",
         "o = Options()\no.deterministic = True\n"
         "ds = D.range(20).map(lambda x: x + 1, num_parallel_calls=4).with_options(o)"),
    Case("options_private_threadpool_keeps_results",
         "o = Options()\no.threading.private_threadpool_size = 1\n"
         "ds = D.range(10).map(lambda x: x * x, num_parallel_calls=4).with_options(o)"),
    Case("options_doc_experimental_threading",
         "options = Options()\noptions.experimental_threading.private_threadpool_size = 10\n"
         "ds = D.range(3).with_options(options)\n"
         "result = (ds.options().threading.private_threadpool_size, "
         "ds.options().experimental_threading.private_threadpool_size)"),
    Case("options_threading_aliases_one_object",
         "o = Options()\no.threading.max_intra_op_parallelism = 2\n"
         "result = (o.experimental_threading.max_intra_op_parallelism, o.threading is o.experimental_threading)"),
    Case("options_equality",
         "a = Options()\na.deterministic = False\nb = Options()\nb.experimental_deterministic = False\n"
         "result = (a == b, a != b, a == Options(), Options() == Options(), a == 5)"),
    Case("options_equality_threading",
         "a = Options()\na.threading.private_threadpool_size = 4\nb = Options()\n"
         "b.experimental_threading.private_threadpool_size = 4\nresult = (a == b, a.threading == b.threading)"),
    Case("options_merge_later_wins",
         "a = Options()\na.deterministic = False\nb = Options()\nb.deterministic = True\nm = a.merge(b)\n"
         "result = (m.deterministic, a.deterministic, b.deterministic, m is a)"),
    Case("options_merge_keeps_unset",
         "a = Options()\na.deterministic = False\na.threading.max_intra_op_parallelism = 2\n"
         "b = Options()\nb.threading.private_threadpool_size = 5\nm = a.merge(b)\n"
         "result = (m.deterministic, m.threading.max_intra_op_parallelism, m.threading.private_threadpool_size)"),
    Case("options_merge_not_options", "result = Options().merge(5)"),
    Case("options_with_options_twice_later_wins",
         "a = Options()\na.deterministic = False\nb = Options()\nb.deterministic = True\n"
         "ds = D.range(3).with_options(a).with_options(b)\nresult = ds.options().deterministic"),
    Case("options_propagate_through_transformations",
         "a = Options()\na.deterministic = False\n"
         "ds = D.range(6).with_options(a).map(lambda x: x).batch(2).prefetch(1)\n"
         "result = (ds.options().deterministic, ds.options() == a)"),
    Case("options_zip_merges_inputs",
         "a = Options()\na.deterministic = False\nb = Options()\nb.threading.private_threadpool_size = 3\n"
         "ds = D.zip((D.range(2).with_options(a), D.range(2).with_options(b)))\n"
         "result = (ds.options().deterministic, ds.options().threading.private_threadpool_size)"),
    Case("options_unknown_option", "o = Options()\no.experimental_foo = 1"),
    Case("options_deterministic_wrong_type", "o = Options()\no.deterministic = 'yes'"),
    Case("options_threadpool_wrong_type", "o = Options()\no.threading.private_threadpool_size = 1.5"),
    Case("options_threading_wrong_type", "o = Options()\no.threading = 5"),
    Case("options_defaults", "o = D.range(3).options()\nresult = (o == Options(), o.threading == Options().threading)"),
]

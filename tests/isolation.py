"""Library state a test process must not carry from one test to the next.

pulumi.dynamic's serialize_provider (run for every dynamic resource a Pulumi program registers: the setup step,
the image release) wraps `pickle._Pickler._batch_setitems` in a sorting wrapper and replaces `save_dict`, and
never takes them off. The wrappers stack: after some 950 dynamic resources in one process every dill pickle of a
dict (datasets' fingerprint of a new Dataset) recurses past Python's limit. One `pulumi up` registers a few, so
only a long test process (a worker evaluating the program hundreds of times) meets it.
"""

import contextlib
import pickle

PICKLER_METHODS = ("_batch_setitems", "save_dict")


@contextlib.contextmanager
def stdlib_pickler():
    """pickle's pure-Python Pickler as it was on entry, given back on exit (whatever was wrapped meanwhile)."""
    saved = {name: pickle._Pickler.__dict__[name] for name in PICKLER_METHODS}
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(pickle._Pickler, name, method)

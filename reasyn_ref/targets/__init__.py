"""The conformance targets reasyn_ref installs: ``reasyn`` and ``reasyn-lean`` (reference.py)
and ``reasyn-kv`` (kv.py)."""
